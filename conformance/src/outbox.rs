//! The outbox suite: intents recorded once, run at most once, uncertain
//! when a run's outcome is unknown ([`coord_adapters::outbox`]).
//!
//! Every check is a plain `async fn` over a [`BoardEnv`] (the outbox runs
//! on any [`coord_adapters::board::Board`]), with the boards' shared
//! `ManualClock`:
//!
//! - [`committed_runs_exactly_once`]: 3 dispatchers (each its own client)
//!   race over 30 intents: each runs exactly once, its result recorded;
//! - [`same_key_deduplicated`]: a key enqueued again with the same payload
//!   is one intent, with another payload it is refused;
//! - [`not_applied_retried_after_backoff`]: a handler that says nothing
//!   took effect runs again after the backoff, not before, and the intent
//!   is dead (never run again) once its attempts are used up;
//! - [`killed_mid_run_is_uncertain`]: a dispatcher that dies mid-run (its
//!   claim runs out) leaves the intent uncertain, never run by the next
//!   dispatcher; a verdict "not applied" runs it once more, "applied"
//!   never;
//! - [`unknown_outcome_is_uncertain`]: a handler that says its outcome is
//!   unknown leaves the intent uncertain, never run again without a verdict.
//!
//! What needs a caller's SQL transaction is [`in_transactions`], which each
//! SQL store's tests run over its `InTransaction` (a [`CallerTransaction`]):
//! an intent rolled back with the caller's rows never runs, one committed
//! runs once, and a key enqueued by two transactions is one intent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::board::{BoardError, RetryPolicy, TaskState};
use coord_adapters::outbox::{Dispatched, HandlerError, Outbox, Verdict};
use coord_backend::{Backend, Clock};

use crate::board::BoardEnv;
use crate::clients::Ctx;
use crate::{ensure, CheckResult, Failure};

const NAME: &str = "mail";

/// How many times each key ran, shared by the handlers of a check.
type Runs = Arc<Mutex<BTreeMap<String, u32>>>;

fn count(runs: &Runs, key: &str) -> u32 {
    runs.lock().unwrap().get(key).copied().unwrap_or(0)
}

/// A handler that counts its run and answers `answer`.
fn counting(
    runs: &Runs,
    answer: fn(&str) -> Result<Vec<u8>, HandlerError>,
) -> impl Fn(coord_adapters::outbox::Intent) -> std::future::Ready<Result<Vec<u8>, HandlerError>> + Clone
{
    let runs = runs.clone();
    move |intent| {
        *runs.lock().unwrap().entry(intent.key.clone()).or_default() += 1;
        std::future::ready(answer(&intent.key))
    }
}

fn sent(key: &str) -> Result<Vec<u8>, HandlerError> {
    Ok(format!("sent {key}").into_bytes())
}

async fn outbox(env: &BoardEnv) -> Result<Outbox, Failure> {
    Outbox::over(env.client().await?, NAME).ctx("Outbox::over")
}

/// 3 dispatchers, each over its own client, race over 30 committed
/// intents: each runs exactly once and its result is recorded.
pub async fn committed_runs_exactly_once(env: BoardEnv) -> CheckResult {
    let setup = outbox(&env).await?;
    let keys: Vec<String> = (0..30).map(|i| format!("order-{i:02}")).collect();
    for key in &keys {
        setup
            .enqueue(key, format!("to {key}").into_bytes())
            .await
            .ctx("enqueue")?;
    }
    let runs: Runs = Arc::default();
    let mut dispatchers = Vec::new();
    for d in 0..3 {
        let dispatcher = outbox(&env).await?.dispatcher(&format!("dispatcher-{d}"));
        let handler = counting(&runs, sent);
        dispatchers.push(tokio::spawn(async move {
            while let Some(done) = dispatcher.dispatch_next(handler.clone()).await? {
                if !matches!(done, Dispatched::Applied { .. }) {
                    return Err(BoardError::Invalid(coord_backend::InvalidInput::Argument(
                        format!("a dispatch that should apply answered {done:?}"),
                    )));
                }
            }
            Ok::<_, BoardError>(())
        }));
    }
    for dispatcher in dispatchers {
        crate::joined(dispatcher, "a dispatcher")
            .await?
            .ctx("dispatcher")?;
    }
    let runs = runs.lock().unwrap().clone();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(twice.is_empty(), "intents run more than once: {twice:?}");
    for key in &keys {
        ensure!(runs.contains_key(key), "committed intent {key} never ran");
        let task = setup.status(key).await.ctx("status")?;
        ensure!(
            matches!(&task.state, TaskState::Completed { result, .. } if *result == sent(key).unwrap()),
            "{key}: its result is not recorded: {task:?}"
        );
    }
    Ok(())
}

/// A key enqueued again with the same payload is one intent (run once);
/// with another payload it is refused and the first one stays.
pub async fn same_key_deduplicated(env: BoardEnv) -> CheckResult {
    let (a, b) = (outbox(&env).await?, outbox(&env).await?);
    a.enqueue("k", b"hello".to_vec()).await.ctx("enqueue")?;
    b.enqueue("k", b"hello".to_vec())
        .await
        .ctx("enqueue of the same key and payload")?;
    match b.enqueue("k", b"other".to_vec()).await {
        Err(BoardError::AlreadyExists { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "enqueue of a key with another payload: expected AlreadyExists, got {other:?}"
            )))
        }
    }
    let runs: Runs = Arc::default();
    let dispatcher = a.dispatcher("d");
    while dispatcher
        .dispatch_next(counting(&runs, sent))
        .await
        .ctx("dispatch_next")?
        .is_some()
    {}
    ensure!(
        count(&runs, "k") == 1,
        "key k ran {} times",
        count(&runs, "k")
    );
    let task = a.status("k").await.ctx("status")?;
    ensure!(
        task.payload == b"hello",
        "the refused enqueue changed the payload"
    );
    Ok(())
}

/// A handler that says nothing took effect runs again after the backoff
/// (not before); after the last allowed attempt the intent is dead and
/// never run again.
pub async fn not_applied_retried_after_backoff(env: BoardEnv) -> CheckResult {
    let outbox = outbox(&env).await?.with_retry(RetryPolicy {
        max_attempts: Some(2),
        initial_backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(10),
    });
    outbox
        .enqueue("flaky", b"x".to_vec())
        .await
        .ctx("enqueue")?;
    let runs: Runs = Arc::default();
    let dispatcher = outbox.dispatcher("d");
    let refuse = |_: &str| Err(HandlerError::not_applied("mail server unavailable"));
    let first = dispatcher
        .dispatch_next(counting(&runs, refuse))
        .await
        .ctx("first dispatch")?;
    let Some(Dispatched::WillRetry { at, .. }) = first else {
        return Err(Failure::new(format!(
            "a handler that applied nothing: expected WillRetry, got {first:?}"
        )));
    };
    let wait = at.duration_since(env.clock.now()).unwrap_or_default();
    ensure!(
        wait >= Duration::from_secs(5),
        "retried after {wait:?}, before half the 10 s backoff"
    );
    ensure!(
        dispatcher
            .dispatch_next(counting(&runs, refuse))
            .await
            .ctx("dispatch during the backoff")?
            .is_none(),
        "an intent ran again during its backoff"
    );
    env.clock.advance(Duration::from_secs(11));
    let second = dispatcher
        .dispatch_next(counting(&runs, refuse))
        .await
        .ctx("dispatch after the backoff")?;
    ensure!(
        matches!(second, Some(Dispatched::GaveUp { .. })),
        "the last allowed attempt failed: expected GaveUp, got {second:?}"
    );
    env.clock.advance(Duration::from_secs(3600));
    ensure!(
        dispatcher
            .dispatch_next(counting(&runs, refuse))
            .await
            .ctx("dispatch of a dead intent")?
            .is_none(),
        "a dead intent ran again"
    );
    ensure!(
        count(&runs, "flaky") == 2,
        "ran {} times, expected 2",
        count(&runs, "flaky")
    );
    let task = outbox.status("flaky").await.ctx("status")?;
    ensure!(
        matches!(&task.state, TaskState::Dead { error: Some(e) } if e.contains("unavailable")),
        "expected dead with the handler's error, got {task:?}"
    );
    Ok(())
}

/// A dispatcher dies mid-run (its handler never answers; its claim runs
/// out): the next dispatcher does not run the intent but finds it
/// uncertain. The verdict "not applied" runs it once more; "applied" (on
/// another intent) never.
pub async fn killed_mid_run_is_uncertain(env: BoardEnv) -> CheckResult {
    let outbox = outbox(&env).await?;
    let ttl = Duration::from_secs(30);
    outbox.enqueue("a", b"x".to_vec()).await.ctx("enqueue")?;
    outbox.enqueue("b", b"y".to_vec()).await.ctx("enqueue")?;
    let runs: Runs = Arc::default();
    // Two dispatchers each start a run and die in it.
    for d in 0..2u32 {
        let dying = outbox.dispatcher(&format!("dying-{d}")).with_ttl(ttl);
        let started = runs.clone();
        let run = tokio::spawn(async move {
            dying
                .dispatch_next(move |intent| {
                    *started.lock().unwrap().entry(intent.key).or_default() += 1;
                    std::future::pending::<Result<Vec<u8>, HandlerError>>()
                })
                .await
        });
        // Once its handler runs, the process dies: its task is dropped mid-run.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while runs.lock().unwrap().values().sum::<u32>() <= d {
            ensure!(
                tokio::time::Instant::now() < deadline && !run.is_finished(),
                "dispatcher {d} never started a handler"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        run.abort();
        let _ = run.await;
    }
    ensure!(
        count(&runs, "a") == 1 && count(&runs, "b") == 1,
        "each intent should have started once: {:?}",
        runs.lock().unwrap()
    );
    env.clock.advance(ttl + Duration::from_secs(1));
    let next = outbox.dispatcher("next").with_ttl(ttl);
    while next
        .dispatch_next(counting(&runs, sent))
        .await
        .ctx("dispatch after the deaths")?
        .is_some()
    {}
    ensure!(
        count(&runs, "a") == 1 && count(&runs, "b") == 1,
        "an intent whose run died was run again without a verdict: {:?}",
        runs.lock().unwrap()
    );
    for key in ["a", "b"] {
        let task = outbox.status(key).await.ctx("status")?;
        ensure!(
            matches!(task.state, TaskState::Uncertain { .. }),
            "{key}: expected uncertain, got {task:?}"
        );
    }
    outbox
        .resolve("a", Verdict::NotApplied)
        .await
        .ctx("resolve a: not applied")?;
    outbox
        .resolve("b", Verdict::Applied)
        .await
        .ctx("resolve b: applied")?;
    while next
        .dispatch_next(counting(&runs, sent))
        .await
        .ctx("dispatch after the verdicts")?
        .is_some()
    {}
    ensure!(
        count(&runs, "a") == 2,
        "a, resolved not applied, ran {} times in all (expected 2)",
        count(&runs, "a")
    );
    ensure!(count(&runs, "b") == 1, "b, resolved applied, ran again");
    Ok(())
}

/// A handler that says its outcome is unknown leaves the intent uncertain:
/// not run again, even long after.
pub async fn unknown_outcome_is_uncertain(env: BoardEnv) -> CheckResult {
    let outbox = outbox(&env).await?;
    outbox.enqueue("u", b"x".to_vec()).await.ctx("enqueue")?;
    let runs: Runs = Arc::default();
    let dispatcher = outbox.dispatcher("d");
    let timeout = |_: &str| Err(HandlerError::unknown("timed out after sending"));
    let first = dispatcher
        .dispatch_next(counting(&runs, timeout))
        .await
        .ctx("dispatch")?;
    ensure!(
        matches!(first, Some(Dispatched::Uncertain { .. })),
        "expected Uncertain, got {first:?}"
    );
    env.clock.advance(Duration::from_secs(24 * 3600));
    ensure!(
        dispatcher
            .dispatch_next(counting(&runs, sent))
            .await
            .ctx("dispatch of an uncertain intent")?
            .is_none(),
        "an uncertain intent ran again"
    );
    let task = outbox.status("u").await.ctx("status")?;
    ensure!(
        matches!(&task.state, TaskState::Uncertain { error: Some(e) } if e.contains("timed out")),
        "expected uncertain with the handler's error, got {task:?}"
    );
    Ok(())
}

/// A caller's SQL transaction with a coord backend bound to it (what a
/// store's `InTransaction` is), for [`in_transactions`].
#[coord_adapters::async_trait]
pub trait CallerTransaction: Send + Sync {
    /// The coord backend whose writes commit or roll back with it.
    fn backend(&self) -> Arc<dyn Backend>;
    /// COMMIT.
    async fn commit(&self) -> coord_backend::Result<()>;
    /// ROLLBACK.
    async fn rollback(&self) -> coord_backend::Result<()>;
}

/// Opens a [`CallerTransaction`] on one namespace.
pub type BeginTransaction = Arc<
    dyn Fn() -> crate::BoxFuture<'static, coord_backend::Result<Arc<dyn CallerTransaction>>>
        + Send
        + Sync,
>;

/// Enqueue `key` with `payload` through a new caller transaction (not
/// committed yet).
async fn enqueue_in(
    begin: &BeginTransaction,
    key: &str,
    payload: &[u8],
) -> Result<(Arc<dyn CallerTransaction>, Result<(), BoardError>), Failure> {
    let tx = begin().await.ctx("beginning a transaction")?;
    let outbox = Outbox::new(tx.backend(), NAME).ctx("Outbox::new")?;
    let enqueued = outbox.enqueue(key, payload.to_vec()).await;
    Ok((tx, enqueued))
}

/// The outbox inside callers' transactions (`begin` opens one on the
/// namespace of `pooled`, the store's ordinary backend):
///
/// - an intent enqueued in a transaction that rolls back never exists and
///   never runs;
/// - one enqueued in a transaction is invisible to dispatchers until the
///   COMMIT, then 3 racing dispatchers run it exactly once;
/// - a key enqueued again in a later transaction with the same payload is
///   the same intent (deduplicated), with another payload refused;
/// - two transactions enqueueing one key at once: after both end, one
///   intent, run once (the second one deduplicated, or refused as
///   unavailable when the store aborted it).
pub async fn in_transactions(begin: BeginTransaction, pooled: Arc<dyn Backend>) -> CheckResult {
    let outside = Outbox::new(pooled.clone(), NAME).ctx("Outbox::new")?;
    let runs: Runs = Arc::default();
    let drain = |who: &'static str| {
        let runs = runs.clone();
        let pooled = pooled.clone();
        async move {
            let mut dispatchers = Vec::new();
            for d in 0..3 {
                let dispatcher = Outbox::new(pooled.clone(), NAME)
                    .ctx("Outbox::new")?
                    .dispatcher(&format!("{who}-{d}"));
                let handler = counting(&runs, sent);
                dispatchers.push(tokio::spawn(async move {
                    while dispatcher.dispatch_next(handler.clone()).await?.is_some() {}
                    Ok::<_, BoardError>(())
                }));
            }
            for dispatcher in dispatchers {
                crate::joined(dispatcher, "a dispatcher")
                    .await?
                    .ctx("dispatcher")?;
            }
            Ok::<_, Failure>(())
        }
    };

    // Rolled back: never there.
    let (tx, enqueued) = enqueue_in(&begin, "rolled-back", b"x").await?;
    enqueued.ctx("enqueue in a transaction")?;
    tx.rollback().await.ctx("rollback")?;
    drain("after-rollback").await?;
    ensure!(
        count(&runs, "rolled-back") == 0,
        "an intent enqueued in a rolled-back transaction ran"
    );
    match outside.status("rolled-back").await {
        Err(BoardError::NotFound { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "an intent enqueued in a rolled-back transaction is there: {other:?}"
            )))
        }
    }

    // Committed: invisible until the COMMIT, then run once.
    let (tx, enqueued) = enqueue_in(&begin, "committed", b"x").await?;
    enqueued.ctx("enqueue in a transaction")?;
    let early = outside.dispatcher("early");
    let seen_early = early
        .dispatch_next(counting(&runs, sent))
        .await
        .ctx("dispatch before the COMMIT")?;
    ensure!(
        seen_early.is_none(),
        "a dispatcher ran an intent before its transaction committed: {seen_early:?}"
    );
    tx.commit().await.ctx("commit")?;
    drain("after-commit").await?;
    ensure!(
        count(&runs, "committed") == 1,
        "a committed intent ran {} times",
        count(&runs, "committed")
    );

    // The same key in later transactions.
    let (tx, enqueued) = enqueue_in(&begin, "committed", b"x").await?;
    enqueued.ctx("enqueue of a done key with the same payload")?;
    tx.commit().await.ctx("commit")?;
    let (tx, enqueued) = enqueue_in(&begin, "committed", b"other").await?;
    let refused = matches!(enqueued, Err(BoardError::AlreadyExists { .. }));
    let _ = tx.rollback().await;
    ensure!(
        refused,
        "a key enqueued again with another payload: expected AlreadyExists, got {enqueued:?}"
    );

    // Two transactions at once on one key.
    let (first, enqueued) = enqueue_in(&begin, "raced", b"x").await?;
    enqueued.ctx("enqueue in the first transaction")?;
    let second = {
        let begin = begin.clone();
        tokio::spawn(async move {
            // A store that locks the whole database (SQLite) may refuse the
            // BEGIN itself while the first transaction holds it.
            let tx = match begin().await {
                Ok(tx) => tx,
                Err(e) => return Ok::<_, Failure>(Err(BoardError::from(e))),
            };
            let enqueued = Outbox::new(tx.backend(), NAME)
                .ctx("Outbox::new")?
                .enqueue("raced", b"x".to_vec())
                .await;
            let ended = match enqueued {
                Ok(()) => tx.commit().await,
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Ok(Err(e));
                }
            };
            Ok(ended.map_err(BoardError::from))
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    first
        .commit()
        .await
        .ctx("commit of the first transaction")?;
    let second = crate::joined(second, "the second transaction").await??;
    ensure!(
        matches!(
            &second,
            Ok(()) | Err(BoardError::Store(coord_backend::Error::Unavailable { .. }))
        ),
        "the second transaction on one key: expected deduplicated or unavailable, got {second:?}"
    );
    drain("after-race").await?;
    ensure!(
        count(&runs, "raced") == 1,
        "a key enqueued by two transactions ran {} times",
        count(&runs, "raced")
    );
    Ok(())
}

crate::__define_suite! {$
    /// The outbox suite's one list of cases (see [`crate::__define_suite!`]).
    __outbox_suite "outbox";
    checks(BoardEnv);
    /// Every case of the outbox suite, over `BoardAdapter`s on a backend
    /// factory with a `ManualClock` (see [`BoardEnv::generic`]).
    cases;
    /// Expand the outbox suite into one `#[tokio::test]` per case, over
    /// `BoardAdapter`s on a [`crate::BackendFactory`] expression.
    outbox_tests(outbox);
    committed_runs_exactly_once,
    same_key_deduplicated,
    not_applied_retried_after_backoff,
    killed_mid_run_is_uncertain,
    unknown_outcome_is_uncertain,
}
