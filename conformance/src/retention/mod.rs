//! The retention suite: pruning completed side-effect keys and completed
//! board tasks after a window (the board's cases are in [`board`]).
//!
//! `SideEffectAdapter::prune` removes keys completed more than the
//! retention ago (see `coord_adapters::retention`). What the suite pins down:
//!
//! - [`completed_keys_go_after_the_window`]: nothing goes inside the
//!   window; after it only completed keys go (in-flight and uncertain keys
//!   and later completions stay), and a pruned key runs again, on a fence
//!   above every fence its resource issued;
//! - [`pruners_race`]: three pruners on separate clients remove every
//!   expired key exactly once between them, and leave no index entry;
//! - [`skewed_clocks_leave_nothing_behind`]: a key completed by an
//!   instance whose clock is behind the one that created the index's
//!   cursor is still counted and removed (no entry below the cursor);
//! - [`prune_is_bounded`]: one pass removes at most its budget and says when
//!   more is left;
//! - [`attention_index_follows_state`]: `open_keys` (what `coordctl inspect`
//!   reads instead of every key) lists exactly the keys in flight or
//!   uncertain, through grant, completion, abandon, marking and resolution.
//!
//! Every check takes a [`Pruner`], so a broken one can be shown red (this
//! crate's `tests/sideeffect.rs` does); [`cases`] use [`adapter_pruner`].

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::retention::{PruneOptions, Pruned};
use coord_adapters::sideeffect::{
    Action, EffectResult, KeyStatus, Outcome, Resolution, Runner, SideEffectAdapter,
    SideEffectError, SideEffectStore,
};
use coord_backend::{Backend, Clock, ManualClock};

use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

pub mod board;

/// One prune pass over a backend, judging time with a clock.
pub type Pruner = Arc<
    dyn Fn(
            Arc<dyn Backend>,
            Arc<dyn Clock>,
            PruneOptions,
        ) -> BoxFuture<'static, Result<Pruned, SideEffectError>>
        + Send
        + Sync,
>;

/// The real one: [`SideEffectAdapter::prune`].
pub fn adapter_pruner() -> Pruner {
    Arc::new(|backend, clock, options| {
        Box::pin(async move {
            SideEffectAdapter::with_clock(backend, clock)
                .prune(&options)
                .await
        })
    })
}

const START_MILLIS: u64 = 1_700_000_000_000;
const WINDOW: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(30);

/// One check's namespace and clock (the board's cases add their own methods).
struct Fixture {
    backends: BackendFactory,
    namespace: String,
    clock: Arc<ManualClock>,
}

impl Fixture {
    fn new(backends: BackendFactory, label: &str) -> Self {
        Fixture {
            backends,
            namespace: unique_namespace(label),
            clock: Arc::new(ManualClock::at_millis(START_MILLIS)),
        }
    }

    async fn backend(&self) -> Result<Arc<dyn Backend>, Failure> {
        Ok((self.backends)(self.namespace.clone()).await?)
    }

    async fn adapter(&self) -> Result<SideEffectAdapter, Failure> {
        Ok(SideEffectAdapter::with_clock(
            self.backend().await?,
            self.clock.clone(),
        ))
    }

    async fn prune(&self, pruner: &Pruner, options: PruneOptions) -> Result<Pruned, Failure> {
        pruner(self.backend().await?, self.clock.clone(), options)
            .await
            .map_err(|e| Failure::new(format!("prune failed: {e}")))
    }

    /// Run `key` to completion on resource `resource`; its fence.
    async fn complete(&self, key: &str, resource: &str) -> Result<u64, Failure> {
        let runner = Runner::new(Arc::new(self.adapter().await?));
        let fence = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = fence.clone();
        let done = runner
            .execute(&Action::new(key, resource), TTL, move |lease| async move {
                seen.store(lease.fence.0, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, std::io::Error>(EffectResult::from(&b"done"[..]))
            })
            .await?;
        ensure!(
            done.outcome == Outcome::Applied,
            "running {key} answered {:?}, expected Applied",
            done.outcome
        );
        Ok(fence.load(std::sync::atomic::Ordering::SeqCst))
    }
}

async fn status(adapter: &SideEffectAdapter, key: &str) -> Result<KeyStatus, Failure> {
    Ok(adapter.key_status(key).await?)
}

/// Nothing goes inside the window; after it only completed keys go; a
/// pruned key runs again on a higher fence.
pub async fn completed_keys_go_after_the_window(
    backends: BackendFactory,
    pruner: Pruner,
) -> CheckResult {
    let fx = Fixture::new(backends, "retention_window");
    let mut fences = Vec::new();
    for i in 0..5 {
        fences.push(fx.complete(&format!("old-{i}"), "payments").await?);
    }
    let adapter = fx.adapter().await?;
    // In flight: granted, never completed (a long lease, so it stays live).
    let busy = adapter
        .acquire(&Action::new("busy", "other"), Duration::from_secs(86_400))
        .await?;
    ensure!(busy.outcome() == Outcome::Applied, "busy was not granted");
    // Uncertain: granted, then marked.
    let unsure = Action::new("unsure", "third");
    let granted = adapter.acquire(&unsure, TTL).await?;
    let lease = granted
        .into_lease()
        .ok_or_else(|| Failure::new("unsure was not granted"))?;
    adapter.mark_uncertain(&unsure, &lease, "timeout").await?;

    fx.clock.advance(Duration::from_secs(30 * 60));
    let early = fx.prune(&pruner, PruneOptions::after(WINDOW)).await?;
    ensure!(
        early.removed == 0,
        "30 minutes after completion, a prune with a 1 h window removed {} keys",
        early.removed
    );
    for i in 0..5 {
        let key = format!("old-{i}");
        ensure!(
            matches!(status(&adapter, &key).await?, KeyStatus::Completed { .. }),
            "{key} is no longer completed inside the window"
        );
    }

    fx.clock.advance(Duration::from_secs(31 * 60));
    fences.push(fx.complete("late", "payments").await?);
    let mut removed = 0;
    for _ in 0..10 {
        let pass = fx.prune(&pruner, PruneOptions::after(WINDOW)).await?;
        removed += pass.removed;
        if !pass.more {
            break;
        }
    }
    ensure!(
        removed == 5,
        "61 minutes after 5 completions, prune removed {removed} keys (expected the 5)"
    );
    for i in 0..5 {
        let key = format!("old-{i}");
        let now = status(&adapter, &key).await?;
        ensure!(
            now == KeyStatus::Idle,
            "{key} reads as {now:?} after its retention (expected idle: record gone)"
        );
    }
    ensure!(
        matches!(status(&adapter, "late").await?, KeyStatus::Completed { .. }),
        "a key completed 0 minutes ago was pruned"
    );
    ensure!(
        matches!(status(&adapter, "busy").await?, KeyStatus::InFlight { .. }),
        "an in-flight key was pruned"
    );
    ensure!(
        matches!(
            status(&adapter, "unsure").await?,
            KeyStatus::Uncertain { .. }
        ),
        "an uncertain key was pruned"
    );
    // A pruned key runs again, as a new key would, on a fence above all.
    let again = fx.complete("old-0", "payments").await?;
    let highest = fences.iter().copied().max().unwrap_or(0);
    ensure!(
        again > highest,
        "old-0 ran again on fence {again}, not above the resource's highest {highest}"
    );
    Ok(())
}

/// Three pruners on separate clients remove every expired key exactly once
/// between them and leave only the index cursor behind.
pub async fn pruners_race(backends: BackendFactory, pruner: Pruner) -> CheckResult {
    const KEYS: u64 = 24;
    let fx = Arc::new(Fixture::new(backends, "retention_race"));
    for i in 0..KEYS {
        fx.complete(&format!("k-{i:02}"), &format!("r-{}", i % 3))
            .await?;
    }
    fx.clock.advance(WINDOW + Duration::from_secs(120));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let fx = fx.clone();
        let pruner = pruner.clone();
        tasks.push(tokio::spawn(async move {
            let mut removed = 0;
            for _ in 0..100 {
                let pass = fx
                    .prune(&pruner, PruneOptions::after(WINDOW).with_max_records(5))
                    .await?;
                removed += pass.removed;
                if !pass.more {
                    break;
                }
            }
            Ok::<u64, Failure>(removed)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task
            .await
            .map_err(|e| Failure::new(format!("pruner task: {e}")))??;
    }
    ensure!(
        total == KEYS,
        "three racing pruners reported {total} removals of {KEYS} expired keys"
    );
    let backend = fx.backend().await?;
    let act = backend.keys("se/act/").await?;
    ensure!(act.is_empty(), "keys left after pruning: {act:?}");
    let index = backend.keys("se/done/").await?;
    ensure!(
        index == vec!["se/done/cursor".to_owned()],
        "index entries left after pruning: {index:?}"
    );
    Ok(())
}

/// A key completed by an instance whose clock runs two minutes behind the
/// one that completed first (and so created the index's cursor at its own
/// minute) is counted by `prune_candidates` and removed like any other: no
/// index entry is written below the cursor, where no prune would look.
pub async fn skewed_clocks_leave_nothing_behind(
    backends: BackendFactory,
    pruner: Pruner,
) -> CheckResult {
    let fx = Fixture::new(backends, "retention_skew");
    fx.complete("on-time", "res").await?;
    let behind = Arc::new(ManualClock::at_millis(START_MILLIS - 120_000));
    let late = Arc::new(SideEffectAdapter::with_clock(
        fx.backend().await?,
        behind.clone(),
    ));
    let done = Runner::new(late.clone())
        .execute(&Action::new("behind", "res"), TTL, |_| async {
            Ok::<_, std::io::Error>(EffectResult::from(&b"done"[..]))
        })
        .await?;
    ensure!(
        done.outcome == Outcome::Applied,
        "running a key on the clock behind answered {:?}",
        done.outcome
    );
    let later = WINDOW + Duration::from_secs(600);
    fx.clock.advance(later);
    behind.advance(later);
    let options = PruneOptions::after(WINDOW);
    let due = fx.adapter().await?.prune_candidates(&options).await?;
    ensure!(
        due.removed == 2,
        "prune_candidates counts {} of the 2 expired keys",
        due.removed
    );
    let mut removed = 0;
    for _ in 0..5 {
        let pass = fx.prune(&pruner, options).await?;
        removed += pass.removed;
        if !pass.more {
            break;
        }
    }
    ensure!(
        removed == 2,
        "prunes removed {removed} of the 2 expired keys"
    );
    let index = fx.backend().await?.keys("se/done/").await?;
    ensure!(
        index == vec!["se/done/cursor".to_owned()],
        "index entries left after pruning: {index:?}"
    );
    Ok(())
}

/// One pass removes at most its budget and says whether more is left.
pub async fn prune_is_bounded(backends: BackendFactory, pruner: Pruner) -> CheckResult {
    let fx = Fixture::new(backends, "retention_bounded");
    for i in 0..10 {
        fx.complete(&format!("b-{i}"), "res").await?;
    }
    fx.clock.advance(WINDOW + Duration::from_secs(120));
    let options = PruneOptions::after(WINDOW).with_max_records(3);
    let first = fx.prune(&pruner, options).await?;
    ensure!(
        first.removed <= 3 && first.more,
        "a pass with a budget of 3 over 10 expired keys reported {first:?}"
    );
    let mut total = first.removed;
    for _ in 0..10 {
        let pass = fx.prune(&pruner, options).await?;
        ensure!(pass.removed <= 3, "a pass removed {} > 3", pass.removed);
        total += pass.removed;
        if !pass.more {
            break;
        }
    }
    ensure!(total == 10, "bounded passes removed {total} of 10 keys");
    Ok(())
}

/// `open_keys` lists exactly the keys in flight or uncertain, whatever
/// moved them there or out (the pruner is not used).
pub async fn attention_index_follows_state(
    backends: BackendFactory,
    _pruner: Pruner,
) -> CheckResult {
    let fx = Fixture::new(backends, "retention_open");
    let adapter = fx.adapter().await?;
    async fn open(adapter: &SideEffectAdapter, when: &str, want: &[&str]) -> CheckResult {
        let got = adapter.open_keys().await?;
        ensure!(
            got == want,
            "{when}: open_keys lists {got:?}, expected {want:?}"
        );
        Ok(())
    }
    open(&adapter, "fresh namespace", &[]).await?;
    let grant = |key: &'static str, resource: &'static str| {
        let adapter = &adapter;
        async move {
            let action = Action::new(key, resource);
            let acquired = adapter.acquire(&action, TTL).await?;
            let lease = acquired
                .into_lease()
                .ok_or_else(|| Failure::new(format!("{key} was not granted")))?;
            Ok::<_, Failure>((action, lease))
        }
    };
    let (a, a_lease) = grant("a", "ra").await?;
    let (b, b_lease) = grant("b", "rb").await?;
    let (c, c_lease) = grant("c", "rc").await?;
    open(&adapter, "after three grants", &["a", "b", "c"]).await?;
    adapter
        .complete(&a, &a_lease, EffectResult::from(&b"ok"[..]))
        .await?;
    open(&adapter, "after completing a", &["b", "c"]).await?;
    adapter.mark_uncertain(&b, &b_lease, "timeout").await?;
    open(&adapter, "after marking b uncertain", &["b", "c"]).await?;
    adapter.abandon(&c, &c_lease, "gave up").await?;
    open(&adapter, "after abandoning c", &["b"]).await?;
    adapter
        .resolve_uncertain(&b, &Resolution::not_applied("checked: never charged"))
        .await?;
    open(&adapter, "after resolving b", &[]).await?;
    // rb is still leased to b's first attempt (marking keeps the lease).
    let (b, b_lease) = grant("b", "rb2").await?;
    adapter.mark_uncertain(&b, &b_lease, "again").await?;
    adapter
        .resolve_uncertain(&b, &Resolution::applied(&b"paid"[..], "checked: charged"))
        .await?;
    open(&adapter, "after resolving b as applied", &[]).await?;
    ensure!(
        matches!(status(&adapter, "b").await?, KeyStatus::Completed { .. }),
        "b is not completed after its applied resolution"
    );
    Ok(())
}

/// Every check of the suite with `pruner`: `(name, result)`.
pub async fn check_all(
    backends: BackendFactory,
    pruner: Pruner,
) -> Vec<(&'static str, CheckResult)> {
    crate::__run_checks!(backends, pruner;
        completed_keys_go_after_the_window,
        pruners_race,
        skewed_clocks_leave_nothing_behind,
        prune_is_bounded,
        attention_index_follows_state,
    )
}

crate::__define_suite! {$
    /// The retention suite's one list of cases (see [`crate::__define_suite!`]).
    __retention_suite "retention" |factory, check, name| check(factory, adapter_pruner());
    /// Every case of the retention suite (with [`adapter_pruner`] and
    /// [`board::adapter_board_pruner`]).
    cases;
    /// Expand the retention suite into one `#[tokio::test]` per case, over a
    /// [`BackendFactory`] expression (or `Option<BackendFactory>`, `None` = skipped).
    retention_tests(retention);
    completed_keys_go_after_the_window,
    pruners_race,
    skewed_clocks_leave_nothing_behind,
    prune_is_bounded,
    attention_index_follows_state,
    completed_tasks_go_after_the_window => |factory| board::completed_tasks_go_after_the_window(
        factory,
        board::adapter_board_pruner(),
    ),
    dependents_stay_claimable => |factory| board::dependents_stay_claimable(
        factory,
        board::adapter_board_pruner(),
    ),
    board_pruners_race => |factory| board::board_pruners_race(
        factory,
        board::adapter_board_pruner(),
    ),
}
