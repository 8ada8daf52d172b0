//! The side-effect suite on the in-process reference store, and proof that
//! it goes red on deliberately broken adapters (each a thin wrapper around
//! the real one that gets exactly one thing wrong).
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::sideeffect::{
    async_trait, Acquired, Action, EffectResult, Execution, Fence, FencedSink, Lease,
    ReconcileClaim, Resolution, SideEffectAdapter, SideEffectError, SideEffectStore,
};
use coord_backend::{Backend, BackendExt, Clock, Mutation};
use coord_conformance::sideeffect::{
    adapter_store, failing_rules, failing_rules_with, MutationSink, SinkFactory, StoreFactory,
};

mod common;

use common::memory;

/// What a broken adapter gets wrong.
#[derive(Clone, Copy, Debug)]
enum Flaw {
    /// Checks "resource busy" before the key's own state (completed, uncertain).
    BusyFirst,
    /// `release` drops the execution intent too (it calls `abandon`).
    ReleaseAbandons,
    /// `renew` extends without checking ownership (and without the store).
    FakeRenew,
    /// `complete` records the result even when the fence is stale.
    CompleteIgnoresFence,
}

#[derive(Debug)]
struct Broken {
    inner: SideEffectAdapter,
    flaw: Flaw,
}

fn broken(
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    flaw: Flaw,
) -> Arc<dyn SideEffectStore> {
    Arc::new(Broken {
        inner: SideEffectAdapter::with_clock(backend, clock),
        flaw,
    })
}

fn busy_first(b: Arc<dyn Backend>, c: Arc<dyn Clock>) -> Arc<dyn SideEffectStore> {
    broken(b, c, Flaw::BusyFirst)
}
fn release_abandons(b: Arc<dyn Backend>, c: Arc<dyn Clock>) -> Arc<dyn SideEffectStore> {
    broken(b, c, Flaw::ReleaseAbandons)
}
fn fake_renew(b: Arc<dyn Backend>, c: Arc<dyn Clock>) -> Arc<dyn SideEffectStore> {
    broken(b, c, Flaw::FakeRenew)
}
fn complete_ignores_fence(b: Arc<dyn Backend>, c: Arc<dyn Clock>) -> Arc<dyn SideEffectStore> {
    broken(b, c, Flaw::CompleteIgnoresFence)
}

#[async_trait]
impl SideEffectStore for Broken {
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError> {
        if let Flaw::BusyFirst = self.flaw {
            if !action.resource.is_empty()
                && self.inner.resource_status(&action.resource).await?.live
            {
                return Ok(Acquired::Contended);
            }
        }
        self.inner.acquire(action, ttl).await
    }

    async fn complete(
        &self,
        action: &Action,
        lease: &Lease,
        result: EffectResult,
    ) -> Result<EffectResult, SideEffectError> {
        match self.inner.complete(action, lease, result.clone()).await {
            // Record anyway wherever the key's attempt can be forced to done
            // (its lease was taken over, expired or released).
            Err(SideEffectError::FenceStale) if matches!(self.flaw, Flaw::CompleteIgnoresFence) => {
                match self
                    .inner
                    .resolve_uncertain(action, &Resolution::applied(result, "fence ignored"))
                    .await
                {
                    Ok(forced) => Ok(forced.result.unwrap_or_default()),
                    Err(_) => Err(SideEffectError::FenceStale),
                }
            }
            other => other,
        }
    }

    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError> {
        match self.flaw {
            // Drops the open intent when there is one, then frees the resource.
            Flaw::ReleaseAbandons => match self.inner.abandon(action, lease, "release").await {
                Err(SideEffectError::FenceStale) => self.inner.release(action, lease).await,
                other => other,
            },
            _ => self.inner.release(action, lease).await,
        }
    }

    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError> {
        match self.flaw {
            Flaw::FakeRenew if ttl.is_zero() => {
                Err(SideEffectError::InvalidAction("zero TTL".into()))
            }
            Flaw::FakeRenew => Ok(Lease {
                expires_at: self.inner.clock().now() + ttl,
                ..lease.clone()
            }),
            _ => self.inner.renew(action, lease, ttl).await,
        }
    }

    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.inner.mark_uncertain(action, lease, reason).await
    }

    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError> {
        self.inner.resolve_uncertain(action, resolution).await
    }

    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.inner.abandon(action, lease, reason).await
    }

    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        self.inner.begin_reconcile(action, ttl).await
    }

    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError> {
        self.inner
            .resolve_uncertain_owned(action, resolution, holder)
            .await
    }
}

/// The names of the rules `stores` fails on memory, printing why.
async fn failing(stores: StoreFactory) -> Vec<&'static str> {
    let failed = failing_rules(memory(), stores).await;
    for (name, failure) in &failed {
        eprintln!("{name}: {failure}");
    }
    failed.into_iter().map(|(name, _)| name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_adapter_passes_through_the_same_runner() {
    // The broken-adapter tests below use this path; it must be green for the real one.
    assert_eq!(failing(adapter_store).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_checked_before_the_key_goes_red() {
    assert_eq!(
        failing(busy_first).await,
        [
            "rule_03_completed_outranks_busy",
            "rule_04_uncertain_outranks_busy",
            "rule_16_release_frees_resource_only",
            "rule_24_uncertain_per_key",
            "rule_25_mark_uncertain_idempotent",
            "rule_32_resolve_without_lease",
            "rule_36_runner_replays_completed",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_that_clears_the_intent_goes_red() {
    assert_eq!(
        failing(release_abandons).await,
        [
            "rule_06_dead_intent_uncertain",
            "rule_14_complete_released_lease",
            "rule_16_release_frees_resource_only",
            "rule_17_stale_release",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fake_renew_goes_red() {
    assert_eq!(
        failing(fake_renew).await,
        [
            "rule_18_renew_extends",
            "rule_19_renew_after_takeover",
            "rule_20_renew_after_expiry",
            "rule_21_renew_atomic",
            "rule_39_runner_ownership_check",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_that_ignores_the_fence_goes_red() {
    assert_eq!(
        failing(complete_ignores_fence).await,
        [
            "rule_13_complete_stale_fence",
            "rule_14_complete_released_lease",
        ]
    );
}

/// A fenced sink that gets one thing wrong.
#[derive(Debug)]
struct BrokenSink {
    backend: Arc<dyn Backend>,
    /// Compare, then write in a second, unconditional txn (the window the
    /// contract forbids). The pause is longer for lower fences, so the race's
    /// losers land last, deterministically.
    split: bool,
}

impl BrokenSink {
    async fn highest(&self, resource: &str) -> Result<u64, SideEffectError> {
        let entry = self.backend.get(&format!("broken-sink/{resource}")).await?;
        Ok(entry
            .value
            .map(|v| String::from_utf8_lossy(&v).parse().unwrap_or(0))
            .unwrap_or(0))
    }
}

#[async_trait]
impl FencedSink for BrokenSink {
    type Write = Vec<Mutation>;

    async fn write_fenced(
        &self,
        resource: &str,
        presented: Fence,
        write: Vec<Mutation>,
    ) -> Result<(), SideEffectError> {
        let mut mutations = write;
        mutations.push(Mutation::put(
            format!("broken-sink/{resource}"),
            presented.0.to_string(),
        ));
        if self.split {
            if presented.0 < self.highest(resource).await? {
                return Err(SideEffectError::FenceStale);
            }
            tokio::time::sleep(Duration::from_millis(50 + 400 / presented.0.max(1))).await;
            self.backend.txn(&[], &mutations).await?;
            Ok(())
        } else {
            // Writes the data first, then refuses: a rejected write wrote something.
            let data: Vec<Mutation> = mutations[..mutations.len() - 1].to_vec();
            self.backend.txn(&[], &data).await?;
            if presented.0 < self.highest(resource).await? {
                return Err(SideEffectError::FenceStale);
            }
            self.backend.txn(&[], &mutations).await?;
            Ok(())
        }
    }
}

fn split_sink(backend: Arc<dyn Backend>) -> Arc<MutationSink> {
    Arc::new(BrokenSink {
        backend,
        split: true,
    })
}

fn write_before_check_sink(backend: Arc<dyn Backend>) -> Arc<MutationSink> {
    Arc::new(BrokenSink {
        backend,
        split: false,
    })
}

async fn failing_sink(sinks: SinkFactory) -> Vec<&'static str> {
    let failed = failing_rules_with(memory(), adapter_store, sinks).await;
    for (name, failure) in &failed {
        eprintln!("{name}: {failure}");
    }
    failed.into_iter().map(|(name, _)| name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_comparing_and_writing_in_two_steps_goes_red() {
    assert_eq!(failing_sink(split_sink).await, ["rule_47_sink_atomic_race"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_writing_before_its_check_goes_red() {
    let failed = failing_sink(write_before_check_sink).await;
    assert_caught(&failed, &["rule_45_sink_lower_fence_rejected"]);
    // It is not atomic either, so the race (47) may or may not catch it too.
    assert!(
        failed.iter().all(|name| [
            "rule_45_sink_lower_fence_rejected",
            "rule_47_sink_atomic_race"
        ]
        .contains(name)),
        "{failed:?}"
    );
}

// ---------------------------------------------------------------- retention

/// The names of the checks that failed (each result printed).
fn failed_names(results: Vec<(&'static str, coord_conformance::CheckResult)>) -> Vec<&'static str> {
    for (name, result) in &results {
        println!("{name}: {result:?}");
    }
    results
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .map(|(name, _)| name)
        .collect()
}

/// Every check of `checks` is among the `failed` ones.
fn assert_caught(failed: &[&str], checks: &[&str]) {
    for check in checks {
        assert!(failed.contains(check), "{check} not caught: {failed:?}");
    }
}

/// The names of the retention checks `pruner` fails on the memory store.
async fn retention_failures(pruner: coord_conformance::retention::Pruner) -> Vec<&'static str> {
    failed_names(coord_conformance::retention::check_all(memory(), pruner).await)
}

/// A pruner judging expiry with a clock two hours ahead (or a retention
/// it was not given): it removes keys inside their window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pruner_ignoring_the_window_is_caught() {
    let early: coord_conformance::retention::Pruner = Arc::new(|backend, clock, options| {
        Box::pin(async move {
            let ahead = coord_backend::ManualClock::at_millis(clock.now_millis());
            ahead.advance(Duration::from_secs(2 * 3600));
            SideEffectAdapter::with_clock(backend, Arc::new(ahead))
                .prune(&options)
                .await
        })
    });
    let failed = retention_failures(early).await;
    assert_caught(&failed, &["completed_keys_go_after_the_window"]);
}

/// A naive pruner: list every side-effect key and delete it, whatever its
/// state and age (no index, no window, no asserts).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pruner_deleting_every_key_is_caught() {
    let naive: coord_conformance::retention::Pruner = Arc::new(|backend, _clock, _options| {
        Box::pin(async move {
            let keys = backend.keys("se/act/").await?;
            let deletes: Vec<Mutation> =
                keys.iter().map(|k| Mutation::delete(k.as_str())).collect();
            if !deletes.is_empty() {
                backend.txn(&[], &deletes).await?;
            }
            Ok(coord_adapters::retention::Pruned::default())
        })
    });
    let failed = retention_failures(naive).await;
    assert_caught(
        &failed,
        &[
            "completed_keys_go_after_the_window",
            "pruners_race",
            "prune_is_bounded",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_pruner_passes() {
    assert!(
        retention_failures(coord_conformance::retention::adapter_pruner())
            .await
            .is_empty()
    );
}

/// The names of the board retention checks `pruner` fails on the memory store.
async fn board_retention_failures(
    pruner: coord_conformance::retention::board::BoardPruner,
) -> Vec<&'static str> {
    failed_names(coord_conformance::retention::board::check_all(memory(), pruner).await)
}

/// A board pruner judging expiry with a clock two hours ahead: it removes
/// tasks inside their window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn board_pruner_ignoring_the_window_is_caught() {
    let early: coord_conformance::retention::board::BoardPruner =
        Arc::new(|backend, clock, options| {
            Box::pin(async move {
                let ahead = coord_backend::ManualClock::at_millis(clock.now_millis());
                ahead.advance(Duration::from_secs(2 * 3600));
                coord_adapters::board::BoardAdapter::with_options(
                    backend,
                    coord_adapters::board::BoardOptions::default().with_clock(Arc::new(ahead)),
                )
                .prune(&options)
                .await
            })
        });
    let failed = board_retention_failures(early).await;
    assert_eq!(failed, ["completed_tasks_go_after_the_window"]);
}

/// A naive board pruner: delete every completed task's record, as a
/// "SELECT completed, then DELETE" job would (no window, no look at the
/// tasks waiting on it, no index).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn board_pruner_ignoring_dependents_is_caught() {
    use coord_adapters::board::{Board, TaskState};
    let naive: coord_conformance::retention::board::BoardPruner =
        Arc::new(|backend, _clock, _options| {
            Box::pin(async move {
                let board = coord_adapters::board::BoardAdapter::new(backend.clone());
                let mut removed = 0;
                for task in board.list().await? {
                    if matches!(task.state, TaskState::Completed { .. }) {
                        let key = format!("board/task/{}", task.id);
                        backend.txn(&[], &[Mutation::delete(key)]).await?;
                        removed += 1;
                    }
                }
                let mut pruned = coord_adapters::retention::Pruned::default();
                pruned.removed = removed;
                Ok(pruned)
            })
        });
    let failed = board_retention_failures(naive).await;
    assert_caught(
        &failed,
        &[
            "completed_tasks_go_after_the_window",
            "dependents_stay_claimable",
            "board_pruners_race",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_real_board_pruner_passes() {
    assert!(
        board_retention_failures(coord_conformance::retention::board::adapter_board_pruner())
            .await
            .is_empty()
    );
}
