//! The board suite: the contract of [`coord_adapters::board::Board`].
//!
//! Every check is a plain `async fn` over a [`BoardEnv`]: a factory of board
//! clients (each call a separate client of the same board, as another
//! process would hold) and the `ManualClock` those boards judge expiry with.
//! [`board_tests!`](crate::board_tests) runs them on [`BoardAdapter`]s over a
//! store; call them directly to check another `Board` implementation.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`claim_race`]: of N agents racing to claim one task, exactly one wins;
//! - [`unmet_dependencies_refused`]: a task whose dependencies are not all completed is not claimable;
//! - [`claim_after_dependencies_complete`]: it is once they are (also completed by another client);
//! - [`fence_increases_on_takeover`]: an expired claim is taken over with a higher fence;
//! - [`renew_checks_ownership`]: wrong token / expired → lease lost, nothing changed; renew extends;
//! - [`release_and_complete_by_token`]: only the live claim's token releases or completes;
//! - [`completed_not_claimable`]: a completed task stays completed;
//! - [`list_shows_everything`]: every task, with its state;
//! - [`board_bad_input`]: typed errors, nothing changed; same-id-other-content is refused;
//! - [`dependency_change_reexpanded`] (adapter only): a dependency list changed between a
//!   claim's read and its commit is read again, and the new dependency is honoured.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{
    Board, BoardAdapter, BoardError, BoardOptions, ClaimedTask, Task, TaskSpec, TaskState,
};
use coord_backend::ManualClock;

use crate::clients::{ClientEnv, ClientFactory, Ctx};
use crate::faults::{Fault, FaultyBackend, Target};
use crate::{ensure, joined, unique_namespace, BackendFactory, CheckResult, Failure};

/// Makes a new client of the board under test.
pub type BoardFactory = ClientFactory<dyn Board, BoardError>;

/// What a board check runs against (see [`ClientEnv`]).
pub type BoardEnv = ClientEnv<dyn Board, BoardError>;

const TTL: Duration = Duration::from_secs(60);

fn task(id: &str) -> TaskSpec {
    TaskSpec::new(id, format!("payload of {id}").into_bytes())
}

/// `Err(expected variant)` or a failure that says what came instead.
macro_rules! expect_err {
    ($call:expr, $pattern:pat, $what:expr) => {
        match $call {
            Err($pattern) => {}
            other => {
                return Err(Failure::new(format!(
                    "{}: expected {}, got {:?}",
                    $what,
                    stringify!($pattern),
                    other
                )))
            }
        }
    };
}

async fn unchanged(board: &Arc<dyn Board>, before: &Task, what: &str) -> CheckResult {
    let after = board.get(&before.id).await.ctx("get")?;
    ensure!(
        &after == before,
        "{what} changed the task: {before:?} became {after:?}"
    );
    Ok(())
}

/// Of 16 agents (each its own client) racing to claim one task, exactly one
/// wins; the others get `AlreadyClaimed`.
pub async fn claim_race(env: BoardEnv) -> CheckResult {
    let setup = env.client().await?;
    setup.add(task("race")).await.ctx("add")?;
    let workers = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let mut racers = Vec::new();
    for i in 0..workers {
        let board = env.client().await?;
        let barrier = barrier.clone();
        racers.push(tokio::spawn(async move {
            barrier.wait().await;
            board.claim("race", &format!("agent-{i}"), TTL).await
        }));
    }
    let mut winners: Vec<ClaimedTask> = Vec::new();
    for racer in racers {
        match racer.await.ctx("racer panicked")? {
            Ok(claimed) => winners.push(claimed),
            Err(BoardError::AlreadyClaimed { .. }) => {}
            // A store error is a failure, never a loser.
            Err(e) => return Err(Failure::new(format!("racing claim: {e}"))),
        }
    }
    ensure!(
        winners.len() == 1,
        "{} of {workers} racing claims won (expected exactly 1)",
        winners.len()
    );
    let won = &winners[0];
    let now = setup.get("race").await.ctx("get")?;
    ensure!(
        matches!(&now.state, TaskState::Claimed { agent, .. } if *agent == won.agent),
        "the stored claim is not the winner's: {now:?}"
    );
    ensure!(
        now.fence == won.fence,
        "stored fence differs from the winner's"
    );
    Ok(())
}

/// A task whose dependencies are not all completed (open, claimed, or not
/// even on the board) is refused with `DependenciesNotMet`, and nothing changes.
pub async fn unmet_dependencies_refused(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    board
        .seed(vec![
            task("a"),
            task("b").with_deps(["a"]),
            task("c").with_deps(["ghost"]),
        ])
        .await
        .ctx("seed")?;
    let before = board.get("b").await.ctx("get")?;
    match board.claim("b", "agent", TTL).await {
        Err(BoardError::DependenciesNotMet { pending, .. }) => {
            ensure!(
                pending == vec!["a".to_owned()],
                "pending should be [a], got {pending:?}"
            )
        }
        other => {
            return Err(Failure::new(format!(
                "claim with an open dependency: expected DependenciesNotMet, got {other:?}"
            )))
        }
    }
    unchanged(&board, &before, "a refused claim").await?;
    let _a = board.claim("a", "agent", TTL).await.ctx("claim a")?;
    expect_err!(
        board.claim("b", "agent", TTL).await,
        BoardError::DependenciesNotMet { .. },
        "claim with a claimed (not completed) dependency"
    );
    expect_err!(
        board.claim("c", "agent", TTL).await,
        BoardError::DependenciesNotMet { .. },
        "claim with a dependency that does not exist"
    );
    unchanged(&board, &before, "a refused claim").await
}

/// Once every dependency is completed the task is claimable, also when the
/// completions were made by another client (whose writes this client did not see).
pub async fn claim_after_dependencies_complete(env: BoardEnv) -> CheckResult {
    let (mine, other) = (env.client().await?, env.client().await?);
    mine.seed(vec![task("a"), task("b"), task("c").with_deps(["a", "b"])])
        .await
        .ctx("seed")?;
    expect_err!(
        mine.claim("c", "me", TTL).await,
        BoardError::DependenciesNotMet { .. },
        "claim before any dependency completed"
    );
    let a = other.claim("a", "other", TTL).await.ctx("claim a")?;
    other
        .complete("a", &a.token, b"ok".to_vec())
        .await
        .ctx("complete a")?;
    match mine.claim("c", "me", TTL).await {
        Err(BoardError::DependenciesNotMet { pending, .. }) => {
            ensure!(
                pending == vec!["b".to_owned()],
                "pending should be [b], got {pending:?}"
            )
        }
        other => {
            return Err(Failure::new(format!(
                "claim with b open: expected DependenciesNotMet, got {other:?}"
            )))
        }
    }
    let b = other.claim("b", "other", TTL).await.ctx("claim b")?;
    other
        .complete("b", &b.token, b"ok".to_vec())
        .await
        .ctx("complete b")?;
    let c = mine
        .claim("c", "me", TTL)
        .await
        .ctx("claim once a and b are completed")?;
    ensure!(c.fence >= 1, "fence of a first claim must be at least 1");
    ensure!(
        c.deps == vec!["a".to_owned(), "b".to_owned()],
        "claimed task lost its deps: {c:?}"
    );
    Ok(())
}

/// An expired claim is taken over with a strictly higher fence; the old
/// token is then worthless; a claim after release gets a higher one still.
pub async fn fence_increases_on_takeover(env: BoardEnv) -> CheckResult {
    let (b1, b2) = (env.client().await?, env.client().await?);
    b1.add(task("t")).await.ctx("add")?;
    let short = Duration::from_secs(10);
    let first = b1.claim("t", "one", short).await.ctx("claim")?;
    expect_err!(
        b2.claim("t", "two", short).await,
        BoardError::AlreadyClaimed { .. },
        "claim of a live claim"
    );
    env.clock.advance(short + Duration::from_millis(1));
    let second = b2
        .claim("t", "two", short)
        .await
        .ctx("takeover of an expired claim")?;
    ensure!(
        second.fence > first.fence,
        "takeover fence {} not above {}",
        second.fence,
        first.fence
    );
    let before = b1.get("t").await.ctx("get")?;
    expect_err!(
        b1.renew("t", &first.token, short).await,
        BoardError::LeaseLost { .. },
        "renew with the taken-over token"
    );
    expect_err!(
        b1.release("t", &first.token).await,
        BoardError::LeaseLost { .. },
        "release with the taken-over token"
    );
    expect_err!(
        b1.complete("t", &first.token, b"x".to_vec()).await,
        BoardError::LeaseLost { .. },
        "complete with the taken-over token"
    );
    unchanged(&b1, &before, "calls with a taken-over token").await?;
    b2.release("t", &second.token).await.ctx("release")?;
    let third = b1
        .claim("t", "one", short)
        .await
        .ctx("claim after release")?;
    ensure!(
        third.fence > second.fence,
        "fence after release {} not above {}",
        third.fence,
        second.fence
    );
    Ok(())
}

/// Renewal is an ownership check: a wrong token, or the right one after the
/// lease expired, gets `LeaseLost` and changes nothing; the right token
/// within the lease extends it to a TTL from now.
pub async fn renew_checks_ownership(env: BoardEnv) -> CheckResult {
    let (mine, other) = (env.client().await?, env.client().await?);
    mine.add(task("t")).await.ctx("add")?;
    let ttl = Duration::from_secs(30);
    let claimed = mine.claim("t", "me", ttl).await.ctx("claim")?;
    let before = mine.get("t").await.ctx("get")?;
    expect_err!(
        other.renew("t", "not-the-token", ttl).await,
        BoardError::LeaseLost { .. },
        "renew with a wrong token"
    );
    expect_err!(
        other.renew("t", "", ttl).await,
        BoardError::LeaseLost { .. } | BoardError::Invalid(_),
        "renew with an empty token"
    );
    unchanged(&mine, &before, "a renew with a wrong token").await?;

    env.clock.advance(ttl * 2 / 3);
    let renewed = mine
        .renew("t", &claimed.token, ttl)
        .await
        .ctx("renew within the lease")?;
    ensure!(
        renewed.expires_at > claimed.expires_at,
        "renew did not move the expiry"
    );
    ensure!(renewed.fence == claimed.fence, "renew changed the fence");
    env.clock.advance(ttl * 2 / 3);
    expect_err!(
        other.claim("t", "other", ttl).await,
        BoardError::AlreadyClaimed { .. },
        "claim past the first lease but within the renewed one"
    );
    env.clock.advance(ttl);
    let expired = mine.get("t").await.ctx("get")?;
    expect_err!(
        mine.renew("t", &claimed.token, ttl).await,
        BoardError::LeaseLost { .. },
        "renew after the lease expired"
    );
    unchanged(&mine, &expired, "a renew after expiry").await?;
    let taken = other
        .claim("t", "other", ttl)
        .await
        .ctx("takeover after expiry")?;
    ensure!(
        taken.fence > claimed.fence,
        "takeover fence did not increase"
    );
    Ok(())
}

/// Only the token of the live claim releases or completes; everything else
/// gets `LeaseLost` and changes nothing.
pub async fn release_and_complete_by_token(env: BoardEnv) -> CheckResult {
    let (mine, other) = (env.client().await?, env.client().await?);
    mine.add(task("t")).await.ctx("add")?;
    let first = mine.claim("t", "me", TTL).await.ctx("claim")?;
    let before = mine.get("t").await.ctx("get")?;
    expect_err!(
        other.release("t", "wrong").await,
        BoardError::LeaseLost { .. },
        "release with a wrong token"
    );
    expect_err!(
        other.complete("t", "wrong", b"r".to_vec()).await,
        BoardError::LeaseLost { .. },
        "complete with a wrong token"
    );
    unchanged(&mine, &before, "release/complete with a wrong token").await?;
    mine.release("t", &first.token).await.ctx("release")?;
    let open = mine.get("t").await.ctx("get")?;
    ensure!(
        open.state == TaskState::Open,
        "released task is not open: {open:?}"
    );
    expect_err!(
        mine.release("t", &first.token).await,
        BoardError::LeaseLost { .. },
        "second release with the same token"
    );
    let second = other
        .claim("t", "other", TTL)
        .await
        .ctx("claim after release")?;
    let before = mine.get("t").await.ctx("get")?;
    expect_err!(
        mine.complete("t", &first.token, b"stale".to_vec()).await,
        BoardError::LeaseLost { .. },
        "complete with a released token"
    );
    unchanged(&mine, &before, "complete with a released token").await?;
    other
        .complete("t", &second.token, b"done".to_vec())
        .await
        .ctx("complete")?;
    let done = mine.get("t").await.ctx("get")?;
    ensure!(
        matches!(&done.state, TaskState::Completed { agent, result } if agent == "other" && result == b"done"),
        "completed task shows {done:?}"
    );
    Ok(())
}

/// A completed task cannot be claimed, renewed or released, ever.
pub async fn completed_not_claimable(env: BoardEnv) -> CheckResult {
    let (mine, other) = (env.client().await?, env.client().await?);
    mine.add(task("t")).await.ctx("add")?;
    let claimed = mine.claim("t", "me", TTL).await.ctx("claim")?;
    mine.complete("t", &claimed.token, b"r".to_vec())
        .await
        .ctx("complete")?;
    let done = mine.get("t").await.ctx("get")?;
    expect_err!(
        other.claim("t", "other", TTL).await,
        BoardError::Completed { .. },
        "claim of a completed task"
    );
    env.clock.advance(TTL * 100);
    expect_err!(
        other.claim("t", "other", TTL).await,
        BoardError::Completed { .. },
        "claim of a completed task, much later"
    );
    ensure!(
        mine.renew("t", &claimed.token, TTL).await.is_err(),
        "renew of a completed task succeeded"
    );
    ensure!(
        mine.release("t", &claimed.token).await.is_err(),
        "release of a completed task succeeded"
    );
    unchanged(&mine, &done, "calls on a completed task").await
}

/// `list` shows every task on the board (including ids with pattern
/// characters) with its state, also tasks added by other clients.
pub async fn list_shows_everything(env: BoardEnv) -> CheckResult {
    let (mine, other) = (env.client().await?, env.client().await?);
    let odd = "x/y%z_*é";
    mine.seed(vec![
        task("open"),
        task("claimed"),
        task("expired"),
        task("done"),
        task(odd),
    ])
    .await
    .ctx("seed")?;
    other
        .add(task("theirs"))
        .await
        .ctx("add from another client")?;
    let short = Duration::from_secs(5);
    mine.claim("expired", "e", short).await.ctx("claim")?;
    env.clock.advance(short + Duration::from_millis(1));
    mine.claim("claimed", "c", TTL).await.ctx("claim")?;
    let d = mine.claim("done", "d", TTL).await.ctx("claim")?;
    mine.complete("done", &d.token, b"R".to_vec())
        .await
        .ctx("complete")?;

    let listed = mine.list().await.ctx("list")?;
    let mut ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec!["claimed", "done", "expired", "open", "theirs", odd];
    expected.sort_unstable();
    ensure!(ids == expected, "list shows {ids:?}, expected {expected:?}");
    for t in &listed {
        let ok = match t.id.as_str() {
            "open" | "theirs" => t.state == TaskState::Open && t.fence == 0,
            "claimed" => matches!(&t.state, TaskState::Claimed { agent, .. } if agent == "c"),
            "expired" => matches!(&t.state, TaskState::Expired { agent, .. } if agent == "e"),
            "done" => matches!(&t.state, TaskState::Completed { result, .. } if result == b"R"),
            _ => t.state == TaskState::Open && t.payload == task(odd).payload,
        };
        ensure!(ok, "list shows a wrong state or content: {t:?}");
    }
    Ok(())
}

/// Bad input is a typed error (`Invalid`, `NotFound`, `AlreadyExists`) and changes nothing.
pub async fn board_bad_input(env: BoardEnv) -> CheckResult {
    let board = env.client().await?;
    board.add(task("t")).await.ctx("add")?;
    board
        .add(task("t"))
        .await
        .ctx("adding the same task again")?;
    let before = board.get("t").await.ctx("get")?;
    expect_err!(
        board.add(task("")).await,
        BoardError::Invalid(_),
        "add with an empty id"
    );
    expect_err!(
        board.add(task("s").with_deps(["s"])).await,
        BoardError::Invalid(_),
        "add of a task depending on itself"
    );
    expect_err!(
        board.add(TaskSpec::new("t", b"other".to_vec())).await,
        BoardError::AlreadyExists { .. },
        "add of an existing id with another payload"
    );
    expect_err!(
        board.add(task("t").with_deps(["x"])).await,
        BoardError::AlreadyExists { .. },
        "add of an existing id with other dependencies"
    );
    expect_err!(
        board.claim("", "agent", TTL).await,
        BoardError::Invalid(_),
        "claim with an empty id"
    );
    expect_err!(
        board.claim("t", "", TTL).await,
        BoardError::Invalid(_),
        "claim with an empty agent"
    );
    expect_err!(
        board.claim("t", "agent", Duration::ZERO).await,
        BoardError::Invalid(_),
        "claim with a zero TTL"
    );
    expect_err!(
        board.claim("missing", "agent", TTL).await,
        BoardError::NotFound { .. },
        "claim of a missing task"
    );
    expect_err!(
        board.get("missing").await,
        BoardError::NotFound { .. },
        "get of a missing task"
    );
    unchanged(&board, &before, "refused calls").await?;
    let claimed = board
        .claim("t", "agent", TTL)
        .await
        .ctx("claim after refused calls")?;
    expect_err!(
        board.renew("t", &claimed.token, Duration::ZERO).await,
        BoardError::Invalid(_),
        "renew with a zero TTL"
    );
    Ok(())
}

/// (Adapter only.) The dependency list of a task changes between a claim's
/// read and its commit (a new, open dependency is added): the claim's txn
/// fails, the new list is read and asserted, and the claim is refused.
pub async fn dependency_change_reexpanded(factory: BackendFactory) -> CheckResult {
    let namespace = unique_namespace("dependency_change");
    let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
    let options = BoardOptions::default().with_clock(clock.clone());
    let plain = BoardAdapter::with_options(factory(namespace.clone()).await?, options.clone());
    plain
        .seed(vec![task("a"), task("b"), task("t").with_deps(["a"])])
        .await
        .ctx("seed")?;
    let a = plain.claim("a", "setup", TTL).await.ctx("claim a")?;
    plain
        .complete("a", &a.token, vec![])
        .await
        .ctx("complete a")?;

    // The claimer's commit (its first writing txn) waits while the task is redefined.
    let window = Arc::new(FaultyBackend::new(factory(namespace).await?, 0));
    window.once(Target::WritingTxn, Fault::Pause);
    let claimer = BoardAdapter::with_options(window.clone(), options);
    let claiming = {
        let claimer = claimer.clone();
        tokio::spawn(async move { claimer.claim("t", "agent", TTL).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !window.is_paused() {
        if claiming.is_finished() || tokio::time::Instant::now() > deadline {
            claiming.abort();
            let answer = claiming.await;
            return Err(Failure::new(format!(
                "the claim never tried to commit: the window was not exercised ({answer:?})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let redefined = plain.redefine(task("t").with_deps(["a", "b"])).await;
    window.resume();
    redefined.ctx("redefine t inside the claim's window")?;
    let answer = joined(claiming, "the claim").await?;
    match answer {
        Err(BoardError::DependenciesNotMet { pending, .. }) => {
            ensure!(pending == vec!["b".to_owned()], "pending should be [b], got {pending:?}")
        }
        other => {
            return Err(Failure::new(format!(
                "claim after its dependency list grew by an open task: expected DependenciesNotMet, got {other:?}"
            )))
        }
    }
    let now = plain.get("t").await.ctx("get")?;
    ensure!(
        now.state == TaskState::Open && now.fence == 0,
        "the refused claim changed the task: {now:?}"
    );
    let b = plain.claim("b", "setup", TTL).await.ctx("claim b")?;
    plain
        .complete("b", &b.token, vec![])
        .await
        .ctx("complete b")?;
    claimer
        .claim("t", "agent", TTL)
        .await
        .ctx("claim once the new dependency is completed")?;
    Ok(())
}

crate::__define_suite! {$
    /// The board suite's one list of cases (see [`crate::__define_suite!`]).
    __board_suite "board";
    checks(BoardEnv);
    /// Every case of the board suite, over [`BoardAdapter`]s on a backend
    /// factory with a `ManualClock` (see [`BoardEnv::generic`]).
    cases;
    /// Expand the board suite into one `#[tokio::test]` per case, over
    /// [`BoardAdapter`]s on a [`BackendFactory`] expression (evaluated once per
    /// test; it may also be an `Option<BackendFactory>`, `None` = skipped).
    board_tests(board);
    claim_race,
    unmet_dependencies_refused,
    claim_after_dependencies_complete,
    fence_increases_on_takeover,
    renew_checks_ownership,
    release_and_complete_by_token,
    completed_not_claimable,
    list_shows_everything,
    board_bad_input,
    dependency_change_reexpanded => |factory| dependency_change_reexpanded(factory),
}
