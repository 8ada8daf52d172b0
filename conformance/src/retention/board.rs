//! The board's half of the retention suite: `BoardAdapter::prune` removes
//! tasks completed more than the retention ago. What it pins down:
//!
//! - [`completed_tasks_go_after_the_window`]: nothing goes inside the
//!   window; after it only completed tasks go (open, held and expired ones
//!   stay), and an id added again after its task went is claimed on a
//!   fence above every fence it had, even once the store
//!   reclaimed the deleted record's tombstone;
//! - [`dependents_stay_claimable`]: tasks waiting on a pruned task (added
//!   before or after it completed, more than fit in one txn) stay
//!   claimable, a task that also waits on an unfinished one still waits
//!   on exactly that one, and no reverse-dependency entry is left behind;
//! - [`board_pruners_race`]: three pruners on separate clients remove every
//!   expired task exactly once between them while dependents are being
//!   added, every dependent added before the prune stays claimable, and a
//!   dependent added during it either is claimable or waits on a pruned id.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, BoardError, BoardOptions, TaskSpec, TaskState};
use coord_adapters::retention::{PruneOptions, Pruned};
use coord_backend::{Backend, Clock, ReclaimOptions};

use super::{Fixture, TTL, WINDOW};
use crate::{ensure, BackendFactory, BoxFuture, CheckResult, Failure};

/// One prune pass of a board (default prefix) over a backend, judging time
/// with a clock.
pub type BoardPruner = Arc<
    dyn Fn(
            Arc<dyn Backend>,
            Arc<dyn Clock>,
            PruneOptions,
        ) -> BoxFuture<'static, Result<Pruned, BoardError>>
        + Send
        + Sync,
>;

/// The real one: [`BoardAdapter::prune`].
pub fn adapter_board_pruner() -> BoardPruner {
    Arc::new(|backend, clock, options| {
        Box::pin(async move {
            BoardAdapter::with_options(backend, BoardOptions::default().with_clock(clock))
                .prune(&options)
                .await
        })
    })
}

impl From<BoardError> for Failure {
    fn from(error: BoardError) -> Self {
        Failure::new(format!("board error: {error}"))
    }
}

impl Fixture {
    async fn board(&self) -> Result<BoardAdapter, Failure> {
        Ok(BoardAdapter::with_options(
            self.backend().await?,
            BoardOptions::default().with_clock(self.clock.clone()),
        ))
    }

    /// Prune passes until one says nothing is left; the total removed.
    async fn prune_all(&self, pruner: &BoardPruner, options: PruneOptions) -> Result<u64, Failure> {
        let mut removed = 0;
        for _ in 0..100 {
            let pass = pruner(self.backend().await?, self.clock.clone(), options)
                .await
                .map_err(|e| Failure::new(format!("prune failed: {e}")))?;
            removed += pass.removed;
            if !pass.more {
                return Ok(removed);
            }
        }
        Err(Failure::new("100 prune passes still said more was left"))
    }
}

/// Claim and complete `id`; the claim's fence.
async fn run(board: &BoardAdapter, id: &str) -> Result<u64, Failure> {
    let claim = board.claim(id, "agent", TTL).await?;
    board.complete(id, &claim.token, b"done".to_vec()).await?;
    Ok(claim.fence)
}

async fn gone(board: &BoardAdapter, id: &str) -> Result<bool, Failure> {
    match board.get(id).await {
        Err(BoardError::NotFound { .. }) => Ok(true),
        Ok(_) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Nothing goes inside the window; after it only completed tasks go; an id
/// added again claims above every fence it had.
pub async fn completed_tasks_go_after_the_window(
    backends: BackendFactory,
    pruner: BoardPruner,
) -> CheckResult {
    let fx = Fixture::new(backends, "board_retention_window");
    let board = fx.board().await?;
    let mut highest = 0;
    for i in 0..4 {
        let id = format!("old-{i}");
        board.add(TaskSpec::new(&id, b"p".to_vec())).await?;
        // old-0 is taken over twice and released once before completing.
        if i == 0 {
            let first = board.claim(&id, "a", Duration::from_secs(1)).await?;
            fx.clock.advance(Duration::from_secs(2));
            let second = board.claim(&id, "b", TTL).await?;
            board.release(&id, &second.token).await?;
            highest = highest.max(first.fence).max(second.fence);
        }
        highest = highest.max(run(&board, &id).await?);
    }
    board.add(TaskSpec::new("open", b"p".to_vec())).await?;
    board.add(TaskSpec::new("held", b"p".to_vec())).await?;
    board
        .claim("held", "a", Duration::from_secs(86_400))
        .await?;
    board.add(TaskSpec::new("expired", b"p".to_vec())).await?;
    board.claim("expired", "a", Duration::from_secs(1)).await?;

    fx.clock.advance(Duration::from_secs(30 * 60));
    let early = fx.prune_all(&pruner, PruneOptions::after(WINDOW)).await?;
    ensure!(
        early == 0,
        "30 minutes after completion, a prune with a 1 h window removed {early} tasks"
    );
    for i in 0..4 {
        let id = format!("old-{i}");
        ensure!(
            matches!(board.get(&id).await?.state, TaskState::Completed { .. }),
            "{id} is no longer completed inside the window"
        );
    }

    fx.clock.advance(Duration::from_secs(31 * 60));
    board.add(TaskSpec::new("late", b"p".to_vec())).await?;
    run(&board, "late").await?;
    let removed = fx.prune_all(&pruner, PruneOptions::after(WINDOW)).await?;
    ensure!(
        removed == 4,
        "61 minutes after 4 completions, prune removed {removed} tasks (expected the 4)"
    );
    for i in 0..4 {
        let id = format!("old-{i}");
        ensure!(
            gone(&board, &id).await?,
            "{id} is still there after its retention"
        );
    }
    ensure!(
        matches!(board.get("late").await?.state, TaskState::Completed { .. }),
        "a task completed 0 minutes ago was pruned"
    );
    for (id, what) in [
        ("open", "an open"),
        ("held", "a held"),
        ("expired", "an expired"),
    ] {
        ensure!(!gone(&board, id).await?, "{what} task was pruned");
    }
    let listed: Vec<String> = board.list().await?.into_iter().map(|t| t.id).collect();
    ensure!(
        listed == ["expired", "held", "late", "open"],
        "the board lists {listed:?} after the prune"
    );

    // The deleted records' tombstones go too; the id's next life still
    // claims above its earlier ones.
    let backend = fx.backend().await?;
    loop {
        match backend.reclaim(&ReclaimOptions::DEFAULT).await {
            Ok(pass) if pass.more => continue,
            Ok(_) | Err(coord_backend::Error::Unsupported { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    board.add(TaskSpec::new("old-0", b"p".to_vec())).await?;
    let again = board.claim("old-0", "a", TTL).await?;
    ensure!(
        again.fence > highest,
        "old-0 added again was claimed on fence {}, not above its earlier {highest}",
        again.fence
    );
    Ok(())
}

/// Tasks waiting on a pruned task stay claimable; a task waiting on an
/// unfinished one too still waits on exactly that one; no entry is left.
pub async fn dependents_stay_claimable(
    backends: BackendFactory,
    pruner: BoardPruner,
) -> CheckResult {
    const BEFORE: usize = 45; // more than fit in one txn on etcd
    let fx = Fixture::new(backends, "board_retention_deps");
    let board = fx.board().await?;
    board.add(TaskSpec::new("x", b"p".to_vec())).await?;
    board.add(TaskSpec::new("v", b"p".to_vec())).await?;
    for i in 0..BEFORE {
        board
            .add(TaskSpec::new(format!("before-{i:02}"), b"p".to_vec()).with_deps(["x"]))
            .await?;
    }
    board
        .add(TaskSpec::new("both", b"p".to_vec()).with_deps(["x", "v"]))
        .await?;
    run(&board, "x").await?;
    board
        .add(TaskSpec::new("after", b"p".to_vec()).with_deps(["x"]))
        .await?;

    fx.clock.advance(WINDOW + Duration::from_secs(120));
    let removed = fx.prune_all(&pruner, PruneOptions::after(WINDOW)).await?;
    ensure!(
        removed == 1,
        "prune removed {removed} tasks, expected x alone"
    );
    ensure!(
        gone(&board, "x").await?,
        "x is still there after its retention"
    );
    for i in 0..BEFORE {
        let id = format!("before-{i:02}");
        board.claim(&id, "a", TTL).await.map_err(|e| {
            Failure::new(format!(
                "{id}, added before x completed, is not claimable once x was pruned: {e}"
            ))
        })?;
    }
    board.claim("after", "a", TTL).await.map_err(|e| {
        Failure::new(format!(
            "after, added once x completed, is not claimable once x was pruned: {e}"
        ))
    })?;
    match board.claim("both", "a", TTL).await {
        Err(BoardError::DependenciesNotMet { pending, .. }) => ensure!(
            pending == ["v"],
            "both waits on {pending:?} once x was pruned, expected [\"v\"]"
        ),
        other => {
            return Err(Failure::new(format!(
                "both, waiting on the unfinished v, answered {other:?}"
            )))
        }
    }
    let backend = fx.backend().await?;
    let entries = backend.keys("board/rdep/").await?;
    ensure!(
        entries == ["board/rdep/1:v/both"],
        "reverse-dependency entries after the prune: {entries:?} (expected both's on v alone)"
    );
    run(&board, "v").await?;
    run(&board, "both").await?;
    let entries = backend.keys("board/rdep/").await?;
    ensure!(
        entries.is_empty(),
        "reverse-dependency entries left once every task completed: {entries:?}"
    );
    Ok(())
}

/// Three pruners race each other and the adds of new dependents.
pub async fn board_pruners_race(backends: BackendFactory, pruner: BoardPruner) -> CheckResult {
    const TASKS: usize = 12;
    let fx = Arc::new(Fixture::new(backends, "board_retention_race"));
    let board = fx.board().await?;
    for i in 0..TASKS {
        let id = format!("t-{i:02}");
        board.add(TaskSpec::new(&id, b"p".to_vec())).await?;
        board
            .add(TaskSpec::new(format!("w-{i:02}"), b"p".to_vec()).with_deps([id.as_str()]))
            .await?;
        run(&board, &id).await?;
    }
    fx.clock.advance(WINDOW + Duration::from_secs(120));
    let mut pruners = Vec::new();
    for _ in 0..3 {
        let fx = fx.clone();
        let pruner = pruner.clone();
        pruners.push(tokio::spawn(async move {
            fx.prune_all(&pruner, PruneOptions::after(WINDOW).with_max_records(3))
                .await
        }));
    }
    let adder = {
        let board = fx.board().await?;
        tokio::spawn(async move {
            for i in 0..TASKS {
                let dep = format!("t-{i:02}");
                board
                    .add(TaskSpec::new(format!("late-{i:02}"), b"p".to_vec()).with_deps([dep]))
                    .await?;
            }
            Ok::<(), Failure>(())
        })
    };
    let mut total = 0;
    for task in pruners {
        total += task
            .await
            .map_err(|e| Failure::new(format!("pruner task: {e}")))??;
    }
    adder
        .await
        .map_err(|e| Failure::new(format!("adder task: {e}")))??;
    ensure!(
        total == TASKS as u64,
        "three racing pruners reported {total} removals of {TASKS} expired tasks"
    );
    let backend = fx.backend().await?;
    let mut waiting_entries = Vec::new();
    for i in 0..TASKS {
        let dep = format!("t-{i:02}");
        ensure!(
            gone(&board, &dep).await?,
            "{dep} is still there after its retention"
        );
        let early = format!("w-{i:02}");
        board.claim(&early, "a", TTL).await.map_err(|e| {
            Failure::new(format!(
                "{early}, added before {dep} completed, is not claimable: {e}"
            ))
        })?;
        let late = format!("late-{i:02}");
        match board.claim(&late, "a", TTL).await {
            Ok(_) => {}
            Err(BoardError::DependenciesNotMet { pending, .. }) if pending == [dep.clone()] => {
                // Added once its dependency was pruned: it waits for that id.
                waiting_entries.push(format!("board/rdep/{}:{dep}/{late}", dep.len()));
            }
            Err(e) => {
                return Err(Failure::new(format!(
                    "{late}, added while {dep} was being pruned, answered {e}"
                )))
            }
        }
    }
    let entries = backend.keys("board/rdep/").await?;
    ensure!(
        entries == waiting_entries,
        "reverse-dependency entries left: {entries:?}, expected those of the tasks still waiting: {waiting_entries:?}"
    );
    let index = backend.keys("board/done/").await?;
    ensure!(
        index == ["board/done/cursor", "board/done/removed"],
        "index entries left after pruning: {index:?}"
    );
    Ok(())
}

/// Every board check of the suite with `pruner`: `(name, result)`.
pub async fn check_all(
    backends: BackendFactory,
    pruner: BoardPruner,
) -> Vec<(&'static str, CheckResult)> {
    crate::__run_checks!(backends, pruner;
        completed_tasks_go_after_the_window,
        dependents_stay_claimable,
        board_pruners_race,
    )
}
