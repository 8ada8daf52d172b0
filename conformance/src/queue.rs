//! The queue suite: the board as a work queue ([`Board::claim_next`],
//! [`Board::fail`], retries, run-at, priorities, `add_many`).
//!
//! Every check but the last is a plain `async fn` over a [`BoardEnv`] (as
//! the board suite), with the boards' shared `ManualClock`:
//!
//! - [`each_ready_task_claimed_once`]: 8 workers drain 60 tasks, each task
//!   claimed by exactly one of them and completed once;
//! - [`priority_then_fifo`]: one worker gets the highest priority first,
//!   first added first within a priority;
//! - [`run_at_respected`]: a task is not claimed before its run-at, and is
//!   at it (also behind ready tasks of a lower priority, within a second);
//! - [`expired_claims_count_as_attempts`]: each claim that ran out is an
//!   attempt; after the last one the task is dead, with the reason;
//! - [`backoff_respected`]: a failed task comes back after its backoff, not
//!   before;
//! - [`dead_after_max_attempts`]: the last failure makes it dead with its
//!   error; `retry_dead` brings it back with its attempts from zero;
//! - [`ready_when_last_dependency_completes`]: a queued task becomes ready
//!   with the completion of its last dependency (also one added before its
//!   dependency existed, and one added in the same `add_many`);
//! - [`add_many_all_or_nothing`]: a batch with one bad task adds nothing;
//! - [`cancel_stops_a_task`]: a cancelled task is never claimed, its
//!   holder's lease is lost;
//! - [`dead_index_follows_death`]: a task that dies (its last failure, or
//!   its last claim running out) is counted dead in its queue and listed
//!   with its error, and no longer once retried or cancelled;
//! - [`queue_depth_counts`]: ready and timed (run-at, live claims) counts,
//!   the oldest ready task's age, the queue's name listed, and a limit that
//!   cuts a listing said so;
//! - [`dead_index_follows_prune`] (over a backend factory): a pruned dead
//!   task leaves its queue's dead count and list;
//! - [`faults_never_double_or_lose`] (over a backend factory): workers whose
//!   answers are lost and whose txns land late never get one task twice,
//!   and every task is completed in the end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::board::{
    Board, BoardAdapter, BoardError, BoardOptions, Failed, QueueDepth, RetryPolicy, TaskSpec,
    TaskState,
};
use coord_backend::{Clock, ManualClock};

use crate::board::BoardEnv;
use crate::clients::Ctx;
use crate::faults::{Fault, FaultyBackend, Target};
use crate::{ensure, BackendFactory, CheckResult, Failure};

const TTL: Duration = Duration::from_secs(60);
const QUEUE: &str = "jobs";

fn job(id: &str) -> TaskSpec {
    TaskSpec::new(id, format!("payload of {id}").into_bytes()).in_queue(QUEUE)
}

/// The id `claim_next` answers (`None`: the queue had nothing ready).
async fn next_id(board: &Arc<dyn Board>, agent: &str) -> Result<Option<String>, Failure> {
    Ok(board
        .claim_next(QUEUE, agent, TTL)
        .await
        .ctx("claim_next")?
        .map(|t| t.id))
}

/// 8 workers (each its own client) drain 60 ready tasks: every task is
/// claimed by exactly one worker, completed once, and nothing is left.
pub async fn each_ready_task_claimed_once(env: BoardEnv) -> CheckResult {
    let setup = env.client().await?;
    let ids: Vec<String> = (0..60).map(|i| format!("t{i:02}")).collect();
    for chunk in ids.chunks(10) {
        setup
            .add_many(chunk.iter().map(|id| job(id)).collect())
            .await
            .ctx("add_many")?;
    }
    let claimed: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..8 {
        let board = env.client().await?;
        let claimed = claimed.clone();
        workers.push(tokio::spawn(async move {
            let agent = format!("worker-{w}");
            while let Some(task) = board.claim_next(QUEUE, &agent, TTL).await? {
                claimed
                    .lock()
                    .unwrap()
                    .entry(task.id.clone())
                    .or_default()
                    .push(agent.clone());
                board.complete(&task.id, &task.token, vec![]).await?;
            }
            Ok::<_, BoardError>(())
        }));
    }
    for worker in workers {
        crate::joined(worker, "a worker").await?.ctx("worker")?;
    }
    let claimed = claimed.lock().unwrap().clone();
    let twice: Vec<_> = claimed.iter().filter(|(_, by)| by.len() > 1).collect();
    ensure!(twice.is_empty(), "tasks claimed more than once: {twice:?}");
    let missing: Vec<_> = ids.iter().filter(|id| !claimed.contains_key(*id)).collect();
    ensure!(missing.is_empty(), "ready tasks never claimed: {missing:?}");
    for id in &ids {
        let task = setup.get(id).await.ctx("get")?;
        ensure!(
            matches!(task.state, TaskState::Completed { .. }),
            "{id} is not completed: {task:?}"
        );
    }
    ensure!(
        next_id(&setup, "late").await?.is_none(),
        "claim_next found a task in a drained queue"
    );
    Ok(())
}

/// One worker claims the highest priority first and, within a priority,
/// the task added first (ids chosen so that id order is not add order).
pub async fn priority_then_fifo(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let added = [("m", 0), ("c", 5), ("z", 0), ("a", -3), ("q", 5), ("b", 0)];
    for (id, priority) in added {
        board
            .add(job(id).with_priority(priority))
            .await
            .ctx("add")?;
        env.clock.advance(Duration::from_millis(1));
    }
    let mut order = Vec::new();
    while let Some(id) = next_id(&board, "solo").await? {
        order.push(id);
    }
    let expected = ["c", "q", "m", "z", "b", "a"];
    ensure!(
        order == expected,
        "claim order {order:?}, expected {expected:?} (priority, then first added)"
    );
    Ok(())
}

/// A task is not claimed before its run-at (neither by `claim_next` nor by
/// id) and is claimed once it passed, also when ready tasks of a lower
/// priority keep the queue busy (a second after it passed, at most).
pub async fn run_at_respected(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let at = env.clock.now() + Duration::from_secs(30);
    board
        .add(job("later").with_run_at(at).with_priority(9))
        .await
        .ctx("add")?;
    ensure!(
        next_id(&board, "w").await?.is_none(),
        "a task was claimed 30 s before its run-at"
    );
    match board.claim("later", "w", TTL).await {
        Err(BoardError::NotReady { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "a claim by id before the run-at: expected NotReady, got {other:?}"
            )))
        }
    }
    // Ready tasks of a lower priority keep the queue busy (in batches
    // every store takes in one txn).
    for batch in 0..2 {
        let busy: Vec<TaskSpec> = (0..10).map(|i| job(&format!("busy{batch}{i}"))).collect();
        board.add_many(busy).await.ctx("add_many")?;
    }
    env.clock.advance(Duration::from_secs(30));
    // A busy queue's timed entries are read at most once a second (of real
    // time): once that second has passed, the due task comes first.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let next = next_id(&board, "w").await?;
    ensure!(
        next.as_deref() == Some("later"),
        "the task due (priority 9) was not claimed first a second after its run-at \
         passed: claimed {next:?}"
    );
    Ok(())
}

/// Each claim whose lease ran out counts as an attempt: with 3 allowed, the
/// third claim that runs out makes the task dead (taking it over finds it
/// so), with an error naming the lease.
pub async fn expired_claims_count_as_attempts(env: BoardEnv) -> CheckResult {
    let (a, b) = (env.client().await?, env.client().await?);
    a.add(job("flaky").with_retry(RetryPolicy::attempts(3)))
        .await
        .ctx("add")?;
    let short = Duration::from_secs(5);
    for attempt in 1..=3u32 {
        let claim = b
            .claim_next(QUEUE, "sleepy", short)
            .await
            .ctx("claim_next")?;
        ensure!(
            claim.as_ref().is_some_and(|c| c.id == "flaky"),
            "attempt {attempt}: claim_next answered {claim:?}"
        );
        let task = a.get("flaky").await.ctx("get")?;
        ensure!(
            task.attempts == attempt,
            "after {attempt} claims the task counts {} attempts",
            task.attempts
        );
        env.clock.advance(short + Duration::from_millis(1));
    }
    ensure!(
        next_id(&a, "w").await?.is_none(),
        "the task was claimed a 4th time with 3 attempts allowed"
    );
    let task = a.get("flaky").await.ctx("get")?;
    match &task.state {
        TaskState::Dead { error: Some(error) } if error.contains("ran out") => Ok(()),
        _ => Err(Failure::new(format!(
            "after its last claim ran out the task should be dead (lease ran out): {task:?}"
        ))),
    }
}

/// A failed attempt comes back after its backoff (within the policy's
/// bounds: between half and all of it), not before.
pub async fn backoff_respected(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let policy =
        RetryPolicy::attempts(5).with_backoff(Duration::from_secs(10), Duration::from_secs(60));
    board
        .add(job("retry").with_retry(policy))
        .await
        .ctx("add")?;
    let claim = board
        .claim_next(QUEUE, "w", TTL)
        .await
        .ctx("claim_next")?
        .ok_or_else(|| Failure::new("nothing to claim"))?;
    let failed_at = env.clock.now();
    let answer = board
        .fail("retry", &claim.token, "boom")
        .await
        .ctx("fail")?;
    let Failed::RetryAt(at) = answer else {
        return Err(Failure::new(format!("first failure answered {answer:?}")));
    };
    let wait = at.duration_since(failed_at).unwrap_or_default();
    ensure!(
        wait >= Duration::from_secs(5) && wait <= Duration::from_secs(10),
        "backoff after the first failure was {wait:?}, expected 5..=10 s"
    );
    env.clock.advance(wait - Duration::from_millis(1));
    ensure!(
        next_id(&board, "w").await?.is_none(),
        "claimed 1 ms before its backoff ended"
    );
    env.clock.advance(Duration::from_millis(1));
    ensure!(
        next_id(&board, "w").await?.as_deref() == Some("retry"),
        "not claimed once its backoff ended"
    );
    let task = board.get("retry").await.ctx("get")?;
    ensure!(
        task.attempts == 2 && task.last_error.as_deref() == Some("boom"),
        "after a failure and a new claim: {task:?}"
    );
    Ok(())
}

/// With 2 attempts allowed, the second failure makes the task dead with its
/// error; it is never claimed again until `retry_dead`, which counts its
/// attempts from zero.
pub async fn dead_after_max_attempts(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let policy =
        RetryPolicy::attempts(2).with_backoff(Duration::from_secs(1), Duration::from_secs(1));
    board
        .add(job("doomed").with_retry(policy))
        .await
        .ctx("add")?;
    for attempt in 1..=2 {
        let claim = board
            .claim_next(QUEUE, "w", TTL)
            .await
            .ctx("claim_next")?
            .ok_or_else(|| Failure::new(format!("attempt {attempt}: nothing to claim")))?;
        let answer = board
            .fail("doomed", &claim.token, &format!("error {attempt}"))
            .await
            .ctx("fail")?;
        let expected_dead = attempt == 2;
        ensure!(
            matches!(answer, Failed::Dead) == expected_dead,
            "failure {attempt} of 2 answered {answer:?}"
        );
        env.clock.advance(Duration::from_secs(2));
    }
    let task = board.get("doomed").await.ctx("get")?;
    ensure!(
        matches!(&task.state, TaskState::Dead { error: Some(e) } if e == "error 2"),
        "dead task shows {task:?}"
    );
    ensure!(
        next_id(&board, "w").await?.is_none(),
        "a dead task was claimed"
    );
    match board.claim("doomed", "w", TTL).await {
        Err(BoardError::Dead { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "claim by id of a dead task: expected Dead, got {other:?}"
            )))
        }
    }
    board.retry_dead("doomed").await.ctx("retry_dead")?;
    ensure!(
        next_id(&board, "w").await?.as_deref() == Some("doomed"),
        "not claimable after retry_dead"
    );
    let task = board.get("doomed").await.ctx("get")?;
    ensure!(task.attempts == 1, "after retry_dead and a claim: {task:?}");
    Ok(())
}

/// A queued task becomes ready with the completion of its last dependency
/// (the next `claim_next` finds it, with nothing else called in between):
/// added after its dependencies, added before one of them existed, and added
/// in the same `add_many` as its dependency.
pub async fn ready_when_last_dependency_completes(env: BoardEnv) -> CheckResult {
    let (board, other) = (env.client().await?, env.client().await?);
    // `early` names `b` before `b` exists.
    board
        .add(job("early").with_deps(["a", "b"]))
        .await
        .ctx("add early")?;
    board
        .add_many(vec![job("a"), job("child").with_deps(["a"])])
        .await
        .ctx("add_many a + child")?;
    board.add(job("b")).await.ctx("add b")?;
    // `b` is held by id, so `a` is the only ready task.
    let b = board.claim("b", "holder", TTL).await.ctx("claim b")?;
    let a = other
        .claim_next(QUEUE, "w", TTL)
        .await
        .ctx("claim_next")?
        .ok_or_else(|| Failure::new("a should be ready"))?;
    ensure!(
        a.id == "a",
        "claimed {} while its dependencies are open",
        a.id
    );
    other
        .complete("a", &a.token, vec![])
        .await
        .ctx("complete a")?;
    ensure!(
        next_id(&board, "w").await?.as_deref() == Some("child"),
        "child (added with a in one add_many) not ready right after a completed"
    );
    ensure!(
        next_id(&board, "w").await?.is_none(),
        "a task was ready while early still waits on b"
    );
    board
        .complete("b", &b.token, vec![])
        .await
        .ctx("complete b")?;
    ensure!(
        next_id(&other, "w").await?.as_deref() == Some("early"),
        "early (added before its dependency b existed) not ready right after b completed"
    );
    Ok(())
}

/// A batch with one task that clashes with a stored one adds nothing, and a
/// batch too large for one txn is refused before anything is stored.
pub async fn add_many_all_or_nothing(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    board.add(job("taken")).await.ctx("add")?;
    let clash = TaskSpec::new("taken", b"other payload".to_vec()).in_queue(QUEUE);
    match board.add_many(vec![job("x"), job("y"), clash]).await {
        Err(BoardError::AlreadyExists { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "a batch clashing with a stored task: expected AlreadyExists, got {other:?}"
            )))
        }
    }
    for id in ["x", "y"] {
        ensure!(
            matches!(board.get(id).await, Err(BoardError::NotFound { .. })),
            "{id} was stored by a refused batch"
        );
    }
    let huge: Vec<TaskSpec> = (0..2000).map(|i| job(&format!("h{i}"))).collect();
    match board.add_many(huge).await {
        Err(BoardError::Invalid(_)) => {}
        other => {
            return Err(Failure::new(format!(
                "a batch of 2000 tasks: expected a typed refusal, got {other:?}"
            )))
        }
    }
    ensure!(
        matches!(board.get("h0").await, Err(BoardError::NotFound { .. })),
        "a refused batch stored its first task"
    );
    let ids: Vec<_> = board.list().await.ctx("list")?;
    ensure!(
        ids.len() == 1,
        "the board holds {} tasks, expected 1",
        ids.len()
    );
    Ok(())
}

/// A cancelled task is never claimed again; the holder of its claim finds
/// its lease lost.
pub async fn cancel_stops_a_task(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    board.add(job("c")).await.ctx("add")?;
    let claim = board
        .claim_next(QUEUE, "w", TTL)
        .await
        .ctx("claim_next")?
        .ok_or_else(|| Failure::new("nothing to claim"))?;
    board.cancel("c").await.ctx("cancel")?;
    match board.complete("c", &claim.token, vec![]).await {
        Err(BoardError::LeaseLost { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "complete of a cancelled task: expected LeaseLost, got {other:?}"
            )))
        }
    }
    env.clock.advance(TTL * 2);
    ensure!(
        next_id(&board, "w").await?.is_none(),
        "a cancelled task was claimed"
    );
    let task = board.get("c").await.ctx("get")?;
    ensure!(
        task.state == TaskState::Cancelled,
        "cancelled task shows {task:?}"
    );
    Ok(())
}

/// How far the queue reads go in these checks (more than any check adds).
const LIMIT: usize = 100;

/// `QUEUE`'s numbers.
async fn depth(board: &Arc<dyn Board>) -> Result<QueueDepth, Failure> {
    board.queue_depth(QUEUE, LIMIT).await.ctx("queue_depth")
}

/// The ids and errors of `QUEUE`'s dead tasks, in order.
async fn dead_list(board: &Arc<dyn Board>) -> Result<Vec<(String, Option<String>)>, Failure> {
    let dead = board.dead_tasks(QUEUE, LIMIT).await.ctx("dead_tasks")?;
    Ok(dead
        .tasks
        .into_iter()
        .map(|d| (d.task.id, d.task.last_error))
        .collect())
}

/// A task dies of its last failure, another of its last claim running out
/// (found by a claimer): each is counted dead in the queue and listed with
/// its error, longest dead first, at the time it died. `retry_dead` takes
/// one out of the count and the list (it is ready again); cancelling the
/// other does too (a cancelled task is not dead).
pub async fn dead_index_follows_death(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let once = RetryPolicy::attempts(1);
    board
        .add(job("d1").with_retry(once).with_priority(1))
        .await
        .ctx("add d1")?;
    board.add(job("d2").with_retry(once)).await.ctx("add d2")?;
    let d1 = board
        .claim_next(QUEUE, "w", TTL)
        .await
        .ctx("claim_next")?
        .ok_or_else(|| Failure::new("d1 should be ready"))?;
    ensure!(d1.id == "d1", "claimed {} first, expected d1", d1.id);
    let died_at = env.clock.now();
    let failed = board.fail("d1", &d1.token, "boom").await.ctx("fail")?;
    ensure!(
        failed == Failed::Dead,
        "its only attempt failed: {failed:?}"
    );
    let after_fail = depth(&board).await?;
    ensure!(
        after_fail.dead.count == 1 && !after_fail.dead.more,
        "after d1 died of its failure the queue counts {} dead: {after_fail:?}",
        after_fail.dead
    );
    let dead = board.dead_tasks(QUEUE, LIMIT).await.ctx("dead_tasks")?;
    ensure!(
        dead.tasks.len() == 1
            && dead.tasks[0].task.id == "d1"
            && dead.tasks[0].died_at == died_at
            && matches!(&dead.tasks[0].task.state, TaskState::Dead { error: Some(e) } if e == "boom"),
        "the dead list after d1 died at {died_at:?}: {dead:?}"
    );
    // d2's only claim runs out; the next claimer finds it dead.
    let short = Duration::from_secs(5);
    let d2 = board
        .claim_next(QUEUE, "sleepy", short)
        .await
        .ctx("claim_next")?;
    ensure!(
        d2.as_ref().is_some_and(|c| c.id == "d2"),
        "claim_next answered {d2:?}, expected d2"
    );
    env.clock.advance(short + Duration::from_millis(1));
    let next = next_id(&board, "w").await?;
    ensure!(
        next.is_none(),
        "claimed {next:?} from a queue of dead tasks"
    );
    let listed = dead_list(&board).await?;
    ensure!(
        listed.len() == 2
            && listed[0].0 == "d1"
            && listed[1].0 == "d2"
            && listed[1]
                .1
                .as_deref()
                .is_some_and(|e| e.contains("ran out")),
        "after d2's last claim ran out the dead list is {listed:?}"
    );
    ensure!(
        depth(&board).await?.dead.count == 2,
        "two dead tasks, the queue counts {}",
        depth(&board).await?.dead
    );
    board.retry_dead("d1").await.ctx("retry_dead")?;
    let after_retry = depth(&board).await?;
    ensure!(
        after_retry.dead.count == 1 && after_retry.ready.count == 1,
        "after retry_dead(d1): {after_retry:?} (expected 1 dead, 1 ready)"
    );
    let listed = dead_list(&board).await?;
    ensure!(
        listed.iter().map(|(id, _)| id.as_str()).eq(["d2"]),
        "after retry_dead(d1) the dead list is {listed:?}"
    );
    board.cancel("d2").await.ctx("cancel")?;
    let after_cancel = depth(&board).await?;
    ensure!(
        after_cancel.dead.count == 0,
        "a cancelled task is still counted dead: {after_cancel:?}"
    );
    ensure!(
        dead_list(&board).await?.is_empty(),
        "a cancelled task is still listed dead"
    );
    Ok(())
}

/// Ready tasks and timed ones (a run-at ahead, a live claim) are counted
/// apart; the oldest ready task's age is the time since it became ready,
/// whatever its priority; the queue's name is listed; a limit below the
/// count answers the limit and says there are more.
pub async fn queue_depth_counts(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    let empty = depth(&board).await?;
    ensure!(
        empty.ready.count == 0 && empty.timed.count == 0 && empty.oldest_ready_age.is_none(),
        "an empty queue: {empty:?}"
    );
    board.add(job("old")).await.ctx("add old")?;
    env.clock.advance(Duration::from_secs(1));
    board
        .add(job("urgent").with_priority(5))
        .await
        .ctx("add urgent")?;
    env.clock.advance(Duration::from_secs(1));
    let later = env.clock.now() + Duration::from_secs(30);
    board
        .add(job("later").with_run_at(later))
        .await
        .ctx("add later")?;
    board
        .add(job("young").with_priority(9))
        .await
        .ctx("add young")?;
    let claimed = next_id(&board, "w").await?;
    ensure!(
        claimed.as_deref() == Some("young"),
        "claimed {claimed:?}, expected young (priority 9)"
    );
    let seen = depth(&board).await?;
    ensure!(
        seen.ready.count == 2 && seen.timed.count == 2 && seen.depth().count == 4,
        "ready old + urgent, timed later (run-at) + young (claimed): {seen:?}"
    );
    ensure!(
        seen.oldest_ready_age == Some(Duration::from_secs(2)),
        "old has been ready for 2 s (urgent, of a higher priority, for 1 s): {seen:?}"
    );
    ensure!(
        !seen.truncated() && seen.dead.count == 0,
        "nothing cut, nothing dead: {seen:?}"
    );
    let cut = board.queue_depth(QUEUE, 1).await.ctx("queue_depth")?;
    ensure!(
        cut.ready.count == 1 && cut.ready.more && cut.timed.more && cut.truncated(),
        "with a limit of 1: {cut:?}"
    );
    let queues = board.queues(LIMIT).await.ctx("queues")?;
    ensure!(
        queues.names.iter().any(|q| q == QUEUE),
        "the queue names do not list {QUEUE}: {queues:?}"
    );
    Ok(())
}

/// A dead task pruned after the retention leaves its queue's dead count
/// and dead list with its record.
pub async fn dead_index_follows_prune(factory: BackendFactory) -> CheckResult {
    use coord_adapters::retention::PruneOptions;
    let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
    let options = BoardOptions::default().with_clock(clock.clone());
    let store = factory(crate::unique_namespace("queue_dead_prune")).await?;
    let adapter = BoardAdapter::with_options(store, options);
    let board: Arc<dyn Board> = Arc::new(adapter.clone());
    board
        .add(job("gone").with_retry(RetryPolicy::attempts(1)))
        .await
        .ctx("add")?;
    let claim = board
        .claim_next(QUEUE, "w", TTL)
        .await
        .ctx("claim_next")?
        .ok_or_else(|| Failure::new("nothing to claim"))?;
    board.fail("gone", &claim.token, "no").await.ctx("fail")?;
    ensure!(
        depth(&board).await?.dead.count == 1,
        "the dead task is not counted dead"
    );
    clock.advance(Duration::from_secs(7200));
    let pruned = adapter
        .prune(&PruneOptions::after(Duration::from_secs(3600)))
        .await
        .ctx("prune")?;
    ensure!(pruned.removed == 1, "prune removed {pruned:?}");
    let after = depth(&board).await?;
    ensure!(
        after.dead.count == 0,
        "a pruned dead task is still counted dead: {after:?}"
    );
    ensure!(
        dead_list(&board).await?.is_empty(),
        "a pruned dead task is still listed"
    );
    Ok(())
}

/// 6 workers whose store loses answers (20% of writing txns) and delays
/// others until later calls (10%) drain 40 tasks, then the leases run out
/// and a clean client drains what is left. No task is held by two claims
/// that were both answered while one was live, no acknowledged completion
/// is of a task another acknowledged completion had completed, and every
/// task ends completed.
pub async fn faults_never_double_or_lose(factory: BackendFactory) -> CheckResult {
    let namespace = crate::unique_namespace("queue_faults");
    let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
    let options = BoardOptions::default().with_clock(clock.clone());
    let plain = BoardAdapter::with_options(factory(namespace.clone()).await?, options.clone());
    let ids: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    for chunk in ids.chunks(10) {
        plain
            .add_many(chunk.iter().map(|id| job(id)).collect())
            .await
            .ctx("add_many")?;
    }
    // (id, fence) of every claim answered; ids of every completion answered Ok.
    let claims: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let completions: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut faulty = Vec::new();
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let store = Arc::new(FaultyBackend::new(
            factory(namespace.clone()).await?,
            100 + w,
        ));
        store.sometimes(Target::WritingTxn, 0.2, Fault::LoseReply);
        store.sometimes(
            Target::WritingTxn,
            0.1,
            Fault::LateCommit { after_calls: 2 },
        );
        faulty.push(store.clone());
        let board = BoardAdapter::with_options(store, options.clone());
        let (claims, completions) = (claims.clone(), completions.clone());
        workers.push(tokio::spawn(async move {
            let agent = format!("worker-{w}");
            let mut empty = 0;
            while empty < 3 {
                let task = match board.claim_next(QUEUE, &agent, TTL).await {
                    Ok(Some(task)) => task,
                    Ok(None) => {
                        empty += 1;
                        continue;
                    }
                    // In doubt: the claim may hold; its lease will run out.
                    Err(_) => continue,
                };
                claims.lock().unwrap().push((task.id.clone(), task.fence));
                if board.complete(&task.id, &task.token, vec![]).await.is_ok() {
                    completions.lock().unwrap().push(task.id.clone());
                }
            }
        }));
    }
    for worker in workers {
        crate::joined(worker, "a worker").await?;
    }
    for store in &faulty {
        store.heal();
        store.flush().await;
    }
    let worker_claims = claims.lock().unwrap().clone();
    // Claims in doubt run out; what they held is drained by a clean client.
    clock.advance(TTL * 2);
    while let Some(task) = plain.claim_next(QUEUE, "drain", TTL).await.ctx("drain")? {
        plain
            .complete(&task.id, &task.token, vec![])
            .await
            .ctx("drain complete")?;
        completions.lock().unwrap().push(task.id.clone());
    }
    let completions = completions.lock().unwrap().clone();
    // The clock stood still while the workers ran: no lease ran out, so two
    // claims of one task answered then were two holders at once.
    let mut held: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (id, fence) in &worker_claims {
        held.entry(id).or_default().push(*fence);
    }
    if let Some((id, fences)) = held.iter().find(|(_, f)| f.len() > 1) {
        return Err(Failure::new(format!(
            "{id} was held by {} live claims at once (fences {fences:?})",
            fences.len()
        )));
    }
    let mut done = BTreeSet::new();
    for id in &completions {
        ensure!(
            done.insert(id),
            "{id} was completed twice (both answered Ok)"
        );
    }
    for id in &ids {
        let task = plain.get(id).await.ctx("get")?;
        ensure!(
            matches!(task.state, TaskState::Completed { .. }),
            "{id} was lost: {task:?}"
        );
    }
    Ok(())
}

crate::__define_suite! {$
    /// The queue suite's one list of cases (see [`crate::__define_suite!`]).
    __queue_suite "queue";
    checks(BoardEnv);
    /// Every case of the queue suite, over [`BoardAdapter`]s on a backend
    /// factory with a `ManualClock` (see [`BoardEnv::generic`]).
    cases;
    /// Expand the queue suite into one `#[tokio::test]` per case, over
    /// [`BoardAdapter`]s on a [`BackendFactory`] expression.
    queue_tests(queue);
    each_ready_task_claimed_once,
    priority_then_fifo,
    run_at_respected,
    expired_claims_count_as_attempts,
    backoff_respected,
    dead_after_max_attempts,
    ready_when_last_dependency_completes,
    add_many_all_or_nothing,
    cancel_stops_a_task,
    dead_index_follows_death,
    queue_depth_counts,
    dead_index_follows_prune => |factory| dead_index_follows_prune(factory),
    faults_never_double_or_lose => |factory| faults_never_double_or_lose(factory),
}
