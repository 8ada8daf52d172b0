//! The side-effect suite: one check per numbered rule of the at-most-once
//! contract (docs/at-most-once.md and `coord_adapters::sideeffect`), named `rule_NN_…` after it.
//!
//! Run it with [`sideeffect_tests!`](crate::sideeffect_tests) or call the
//! checks directly. Each check is a plain `async fn` over a [`Fixture`]: a
//! fresh namespace of the store under test, a [`ManualClock`] shared by every
//! client of the check, and a [`StoreFactory`] that builds the
//! [`SideEffectStore`] under test over a backend and that clock. The suite's
//! own [`cases`] use [`adapter_store`] (the real [`SideEffectAdapter`]);
//! [`rules`], [`check_rule`] and [`failing_rules`] take any factory, so a broken adapter can be
//! plugged in and shown red (this crate's `tests/sideeffect.rs` does).
//!
//! Checks open several clients of one namespace (one backend handle each)
//! where the rule is about racing or about state surviving a fresh client.
//! Checks 45–47 exercise the downstream half: the fenced sink a
//! [`SinkFactory`] builds ([`backend_sink`], i.e. [`BackendFencedSink`], by default).
//!
//! Where a rule leaves a choice, the check follows the choices documented in
//! `coord_adapters::sideeffect` (renew refusals are `LeaseLost`; `complete`
//! frees the resource; a retry-safe intent whose lease is gone may be granted
//! again; an intent whose lease is gone can be resolved). Rule 9 covers
//! release, expiry, takeover, completion and abandon; the adapter never
//! deletes a resource record (the backend suite covers version survival
//! across deletes).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::sideeffect::{
    async_trait, Acquired, Action, BackendFencedSink, EffectResult, Execution, Fence, FencedSink,
    Lease, Outcome, ReconcileClaim, Resolution, RetrySafety, Runner, SideEffectAdapter,
    SideEffectError, SideEffectStore,
};
use coord_backend::{Backend, BackendExt, Clock, Entry, Error, ManualClock, Mutation};

use crate::faults::{Fault, FaultyBackend, Target};
use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, Case, CheckResult, Failure};

/// Builds the side-effect store under test over a backend and a clock.
pub type StoreFactory = fn(Arc<dyn Backend>, Arc<dyn Clock>) -> Arc<dyn SideEffectStore>;

/// A fenced sink writing mutations (what rules 45–47 check).
pub type MutationSink = dyn FencedSink<Write = Vec<Mutation>>;

/// Builds the fenced sink under test over a backend.
pub type SinkFactory = fn(Arc<dyn Backend>) -> Arc<MutationSink>;

/// The real sink: [`BackendFencedSink::new`].
pub fn backend_sink(backend: Arc<dyn Backend>) -> Arc<MutationSink> {
    Arc::new(BackendFencedSink::new(backend))
}

/// The real adapter: [`SideEffectAdapter::with_clock`].
pub fn adapter_store(backend: Arc<dyn Backend>, clock: Arc<dyn Clock>) -> Arc<dyn SideEffectStore> {
    Arc::new(SideEffectAdapter::with_clock(backend, clock))
}

impl From<SideEffectError> for Failure {
    fn from(error: SideEffectError) -> Self {
        Failure::new(format!("unexpected side-effect error: {error} ({error:?})"))
    }
}

/// The lease TTL every check uses.
pub const TTL: Duration = Duration::from_secs(10);
const PAST_TTL: Duration = Duration::from_millis(10_001);
const START_MILLIS: u64 = 1_700_000_000_000;

/// What one check runs against: a fresh namespace, a manual clock, a store factory.
#[derive(Clone)]
pub struct Fixture {
    backends: BackendFactory,
    stores: StoreFactory,
    sinks: SinkFactory,
    namespace: String,
    clock: Arc<ManualClock>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture with a namespace of its own (see [`unique_namespace`]).
    pub fn new(backends: BackendFactory, stores: StoreFactory, label: &str) -> Self {
        Fixture {
            backends,
            stores,
            sinks: backend_sink,
            namespace: unique_namespace(label),
            clock: Arc::new(ManualClock::at_millis(START_MILLIS)),
        }
    }

    /// The same fixture checking another fenced sink.
    pub fn with_sinks(mut self, sinks: SinkFactory) -> Self {
        self.sinks = sinks;
        self
    }

    /// A fenced sink under test over a new client.
    pub async fn sink(&self) -> Result<Arc<MutationSink>, Failure> {
        Ok((self.sinks)(self.backend().await?))
    }

    /// A new client of the fixture's namespace.
    pub async fn backend(&self) -> Result<Arc<dyn Backend>, Failure> {
        Ok((self.backends)(self.namespace.clone()).await?)
    }

    /// A store under test over a new client, judging time with the shared clock.
    pub async fn store(&self) -> Result<Arc<dyn SideEffectStore>, Failure> {
        Ok((self.stores)(self.backend().await?, self.clock.clone()))
    }

    /// A store under test over a new client, with its own clock (clock skew).
    pub async fn store_with_clock(
        &self,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn SideEffectStore>, Failure> {
        Ok((self.stores)(self.backend().await?, clock))
    }

    /// A store under test over `backend` with the shared clock.
    pub fn store_over(&self, backend: Arc<dyn Backend>) -> Arc<dyn SideEffectStore> {
        (self.stores)(backend, self.clock.clone())
    }

    /// A runner over a new store under test.
    pub async fn runner(&self) -> Result<Runner, Failure> {
        Ok(Runner::new(self.store().await?))
    }

    /// The clock every store of the fixture shares.
    pub fn clock(&self) -> &Arc<ManualClock> {
        &self.clock
    }

    /// Move the shared clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// A clock reading the shared clock's time plus `ahead`, not moving with it.
    fn skewed_clock(&self, ahead: Duration) -> Arc<dyn Clock> {
        let clock = ManualClock::at_millis(self.clock.now_millis());
        clock.advance(ahead);
        Arc::new(clock)
    }
}

/// One rule check, runnable with any store factory.
#[derive(Clone, Copy)]
pub struct Rule {
    /// `rule_NN_…`, the rule number first.
    pub name: &'static str,
    /// The check.
    pub run: fn(Fixture) -> BoxFuture<'static, CheckResult>,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rule({})", self.name)
    }
}

/// A check that does not finish within this time fails (a broken adapter may loop).
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

async fn bounded(name: &str, check: impl Future<Output = CheckResult>) -> CheckResult {
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(result) => result,
        Err(_) => Err(Failure::new(format!(
            "{name} did not finish within {CHECK_TIMEOUT:?}"
        ))),
    }
}

/// Run one rule against the stores `stores` builds over `backends`' store
/// (and the real [`BackendFencedSink`]).
pub async fn check_rule(
    backends: BackendFactory,
    stores: StoreFactory,
    rule: &Rule,
) -> CheckResult {
    check_rule_with(backends, stores, backend_sink, rule).await
}

/// Run one rule with a store factory and a sink factory of your own.
pub async fn check_rule_with(
    backends: BackendFactory,
    stores: StoreFactory,
    sinks: SinkFactory,
    rule: &Rule,
) -> CheckResult {
    let fixture = Fixture::new(backends, stores, rule.name).with_sinks(sinks);
    bounded(rule.name, (rule.run)(fixture)).await
}

/// Run every rule; return the ones that failed, with why (in rule order).
pub async fn failing_rules(
    backends: BackendFactory,
    stores: StoreFactory,
) -> Vec<(&'static str, Failure)> {
    failing_rules_with(backends, stores, backend_sink).await
}

/// [`failing_rules`] with a sink factory of your own.
pub async fn failing_rules_with(
    backends: BackendFactory,
    stores: StoreFactory,
    sinks: SinkFactory,
) -> Vec<(&'static str, Failure)> {
    let mut failed = Vec::new();
    for rule in rules() {
        if let Err(failure) = check_rule_with(backends.clone(), stores, sinks, &rule).await {
            failed.push((rule.name, failure));
        }
    }
    failed
}

async fn run_case<F, Fut>(backends: BackendFactory, name: &'static str, check: F) -> CheckResult
where
    F: FnOnce(Fixture) -> Fut,
    Fut: Future<Output = CheckResult>,
{
    let fixture = Fixture::new(backends, adapter_store, name);
    bounded(name, check(fixture)).await
}

macro_rules! define_rules {
    ($($name:ident),* $(,)?) => {
        /// Every rule check, in rule order, runnable with any [`StoreFactory`].
        pub fn rules() -> Vec<Rule> {
            vec![$(
                Rule {
                    name: stringify!($name),
                    run: |fixture| -> BoxFuture<'static, CheckResult> { Box::pin($name(fixture)) },
                },
            )*]
        }

        /// Every case of the side-effect suite, against the real adapter ([`adapter_store`]).
        pub fn cases() -> Vec<Case> {
            vec![$(
                Case {
                    suite: "sideeffect",
                    name: stringify!($name),
                    run: |backends| -> BoxFuture<'static, CheckResult> {
                        Box::pin(run_case(backends, stringify!($name), $name))
                    },
                },
            )*]
        }
    };
}

define_rules!(
    rule_01_invalid_action,
    rule_02_one_atomic_step,
    rule_03_completed_outranks_busy,
    rule_04_uncertain_outranks_busy,
    rule_05_live_intent_contended,
    rule_06_dead_intent_uncertain,
    rule_07_busy_resource_contended,
    rule_08_grant_fence_and_intent,
    rule_09_fences_never_reused,
    rule_10_takeover_after_expiry,
    rule_11_complete_records_result,
    rule_12_complete_first_result_wins,
    rule_13_complete_stale_fence,
    rule_14_complete_released_lease,
    rule_15_complete_other_resource,
    rule_16_release_frees_resource_only,
    rule_17_stale_release,
    rule_18_renew_extends,
    rule_19_renew_after_takeover,
    rule_20_renew_after_expiry,
    rule_21_renew_atomic,
    rule_22_abandon_allows_rerun,
    rule_23_abandon_stale_lease,
    rule_24_uncertain_per_key,
    rule_25_mark_uncertain_idempotent,
    rule_26_mark_uncertain_stale_fence,
    rule_27_mark_uncertain_one_txn,
    rule_28_resolve_applied,
    rule_29_resolve_not_applied,
    rule_30_first_resolution_wins,
    rule_31_resolve_not_uncertain,
    rule_32_resolve_without_lease,
    rule_33_one_reconciler,
    rule_34_owned_resolve,
    rule_35_runner_no_store,
    rule_36_runner_replays_completed,
    rule_37_runner_contended,
    rule_38_runner_prepare_fails,
    rule_39_runner_ownership_check,
    rule_40_runner_apply_gets_lease,
    rule_41_runner_apply_fails_safe,
    rule_42_runner_apply_fails_unknown,
    rule_43_runner_complete_fails,
    rule_44_runner_reconcile_and_run,
    rule_45_sink_lower_fence_rejected,
    rule_46_sink_equal_fence_allowed,
    rule_47_sink_atomic_race,
);

/// Expand the side-effect suite into one `#[tokio::test]` per rule for a
/// [`BackendFactory`] expression (evaluated once per test).
#[macro_export]
macro_rules! sideeffect_tests {
    ($factory:expr) => {
        $crate::__cases_as_tests!($crate::sideeffect::cases, $factory;
            rule_01_invalid_action,
            rule_02_one_atomic_step,
            rule_03_completed_outranks_busy,
            rule_04_uncertain_outranks_busy,
            rule_05_live_intent_contended,
            rule_06_dead_intent_uncertain,
            rule_07_busy_resource_contended,
            rule_08_grant_fence_and_intent,
            rule_09_fences_never_reused,
            rule_10_takeover_after_expiry,
            rule_11_complete_records_result,
            rule_12_complete_first_result_wins,
            rule_13_complete_stale_fence,
            rule_14_complete_released_lease,
            rule_15_complete_other_resource,
            rule_16_release_frees_resource_only,
            rule_17_stale_release,
            rule_18_renew_extends,
            rule_19_renew_after_takeover,
            rule_20_renew_after_expiry,
            rule_21_renew_atomic,
            rule_22_abandon_allows_rerun,
            rule_23_abandon_stale_lease,
            rule_24_uncertain_per_key,
            rule_25_mark_uncertain_idempotent,
            rule_26_mark_uncertain_stale_fence,
            rule_27_mark_uncertain_one_txn,
            rule_28_resolve_applied,
            rule_29_resolve_not_applied,
            rule_30_first_resolution_wins,
            rule_31_resolve_not_uncertain,
            rule_32_resolve_without_lease,
            rule_33_one_reconciler,
            rule_34_owned_resolve,
            rule_35_runner_no_store,
            rule_36_runner_replays_completed,
            rule_37_runner_contended,
            rule_38_runner_prepare_fails,
            rule_39_runner_ownership_check,
            rule_40_runner_apply_gets_lease,
            rule_41_runner_apply_fails_safe,
            rule_42_runner_apply_fails_unknown,
            rule_43_runner_complete_fails,
            rule_44_runner_reconcile_and_run,
            rule_45_sink_lower_fence_rejected,
            rule_46_sink_equal_fence_allowed,
            rule_47_sink_atomic_race,
        );
    };
}

// ---------------------------------------------------------------- helpers

/// Fail unless `$result` is an `Err` matching `$pattern`.
macro_rules! expect_err {
    ($result:expr, $pattern:pat, $($context:tt)+) => {
        match $result {
            Err($pattern) => {}
            other => {
                return Err(Failure::new(format!(
                    "{}: expected Err({}), got {:?}",
                    format!($($context)+),
                    stringify!($pattern),
                    other
                )))
            }
        }
    };
}

fn action(key: &str, resource: &str) -> Action {
    Action::new(key, resource)
}

fn result(text: &str) -> EffectResult {
    EffectResult::from(text)
}

/// Acquire; the outcome must be `Applied` with a lease.
async fn grant(store: &Arc<dyn SideEffectStore>, action: &Action) -> Result<Lease, Failure> {
    let acquired = store.acquire(action, TTL).await?;
    ensure!(
        acquired.outcome == Outcome::Applied,
        "acquire {:?} on {:?}: expected Applied, got {:?}",
        action.key,
        action.resource,
        acquired
    );
    acquired
        .lease
        .ok_or_else(|| Failure::new("Applied without a lease"))
}

/// Acquire; the outcome must be `expected`, with no lease (and no result unless replayed).
async fn expect_outcome(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
    expected: Outcome,
    context: &str,
) -> Result<Acquired, Failure> {
    let acquired = store.acquire(action, TTL).await?;
    ensure!(
        acquired.outcome == expected,
        "{context}: acquire {:?} → {:?}, expected {expected:?}",
        action.key,
        acquired
    );
    if expected != Outcome::Applied {
        ensure!(
            acquired.lease.is_none(),
            "{context}: {expected:?} came with a lease (a fence was issued): {acquired:?}"
        );
    }
    Ok(acquired)
}

/// Acquire; the outcome must be `Replayed` with `text` as result.
async fn expect_replayed(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
    text: &str,
    context: &str,
) -> CheckResult {
    let acquired = expect_outcome(store, action, Outcome::Replayed, context).await?;
    ensure!(
        acquired.result == Some(result(text)),
        "{context}: replayed {:?}, expected {text:?}",
        acquired.result
    );
    Ok(())
}

/// Acquire, mark uncertain, release: the key is uncertain and the resource free.
async fn make_uncertain(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
) -> Result<Lease, Failure> {
    let lease = grant(store, action).await?;
    store.mark_uncertain(action, &lease, "conformance").await?;
    store.release(action, &lease).await?;
    Ok(lease)
}

/// Every key of the namespace with its entry.
async fn dump(backend: &Arc<dyn Backend>) -> Result<Vec<Entry>, Failure> {
    let keys = backend.keys("").await?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    Ok(backend.snapshot(&keys).await?)
}

fn io_error(text: &str) -> std::io::Error {
    std::io::Error::other(text.to_owned())
}

async fn join<T>(task: tokio::task::JoinHandle<T>) -> Result<T, Failure> {
    task.await
        .map_err(|e| Failure::new(format!("a racing task panicked: {e}")))
}

// ---------------------------------------------------------------- acquire

/// Rule 1: empty key or resource, or a zero TTL → invalid-action error; nothing stored.
pub async fn rule_01_invalid_action(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let backend = fx.backend().await?;
    expect_err!(
        store.acquire(&action("", "r"), TTL).await,
        SideEffectError::InvalidAction(_),
        "acquire with an empty key"
    );
    expect_err!(
        store.acquire(&action("k", ""), TTL).await,
        SideEffectError::InvalidAction(_),
        "acquire with an empty resource"
    );
    expect_err!(
        store.acquire(&action("k", "r"), Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "acquire with a zero TTL"
    );
    let stored = dump(&backend).await?;
    ensure!(stored.is_empty(), "invalid acquires stored {stored:?}");

    let valid = action("k", "r");
    let lease = grant(&store, &valid).await?;
    let before = dump(&backend).await?;
    expect_err!(
        store.renew(&valid, &lease, Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "renew with a zero TTL"
    );
    expect_err!(
        store.complete(&action("", "r"), &lease, result("x")).await,
        SideEffectError::InvalidAction(_),
        "complete with an empty key"
    );
    expect_err!(
        store.begin_reconcile(&valid, Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "begin_reconcile with a zero TTL"
    );
    ensure!(
        dump(&backend).await? == before,
        "an invalid call changed what is stored"
    );
    Ok(())
}

/// Rule 2: rules 3–9 are one atomic step: N racing acquires of one fresh key
/// → exactly one Applied; N racing keys on one free resource → exactly one Applied.
pub async fn rule_02_one_atomic_step(fx: Fixture) -> CheckResult {
    const RACERS: usize = 16;
    for (round, same_key) in [(0, true), (1, false)] {
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for racer in 0..RACERS {
            let store = fx.store().await?;
            let barrier = barrier.clone();
            let key = if same_key {
                format!("k{round}")
            } else {
                format!("k{round}-{racer}")
            };
            let act = action(&key, &format!("r{round}"));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.acquire(&act, TTL).await
            }));
        }
        let mut applied = Vec::new();
        for task in tasks {
            let acquired = join(task).await??;
            match acquired.outcome {
                Outcome::Applied => applied.push(acquired.lease),
                Outcome::Contended => {
                    ensure!(acquired.lease.is_none(), "Contended came with a lease")
                }
                other => {
                    return Err(Failure::new(format!(
                        "racing acquire on a fresh {} → {other:?}",
                        if same_key { "key" } else { "resource" }
                    )))
                }
            }
        }
        ensure!(
            applied.len() == 1,
            "{} of {RACERS} racing acquires ({}) were Applied (expected exactly 1)",
            applied.len(),
            if same_key {
                "one key"
            } else {
                "one resource, distinct keys"
            }
        );
        let fence = applied[0].as_ref().map(|l| l.fence);
        ensure!(
            fence == Some(Fence(1)),
            "the single grant on a fresh resource has {fence:?}, expected fence 1"
        );
    }
    Ok(())
}

/// Rule 3: a completed key → Replayed with the stored result, no fence,
/// even while another action holds the resource.
pub async fn rule_03_completed_outranks_busy(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let la = grant(&store, &a).await?;
    store.complete(&a, &la, result("ra")).await?;
    let lb = grant(&store, &b).await?;
    expect_replayed(
        &fx.store().await?,
        &a,
        "ra",
        "completed key while the resource is held",
    )
    .await?;
    store.complete(&b, &lb, result("rb")).await?;
    fx.advance(PAST_TTL);
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(lb.fence.0 + 1),
        "the replay issued a fence: next grant has {:?} after {:?}",
        lc.fence,
        lb.fence
    );
    Ok(())
}

/// Rule 4: an uncertain key → Uncertain, no fence, also while the resource is busy.
pub async fn rule_04_uncertain_outranks_busy(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    make_uncertain(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "uncertain key while the resource is held",
    )
    .await?;
    store.release(&b, &lb).await?;
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(lb.fence.0 + 1),
        "the Uncertain answer issued a fence: next grant has {:?} after {:?}",
        lc.fence,
        lb.fence
    );
    Ok(())
}

/// Rule 5: an unresolved intent whose lease is live → Contended (in flight).
pub async fn rule_05_live_intent_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let lease = grant(&store, &a).await?;
    expect_outcome(&fx.store().await?, &a, Outcome::Contended, "key in flight").await?;
    fx.advance(TTL / 2);
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Contended,
        "key in flight, later",
    )
    .await?;
    // The in-flight holder is unaffected.
    store.complete(&a, &lease, result("done")).await?;
    Ok(())
}

/// Rule 6: an intent whose lease expired or was released → Uncertain, never
/// silently granted again; a declared retry-safe action may be granted again.
pub async fn rule_06_dead_intent_uncertain(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let expired = action("expired", "r1");
    grant(&store, &expired).await?;
    fx.advance(PAST_TTL);
    expect_outcome(
        &fx.store().await?,
        &expired,
        Outcome::Uncertain,
        "intent whose lease expired",
    )
    .await?;
    expect_outcome(
        &fx.store().await?,
        &expired,
        Outcome::Uncertain,
        "asked again",
    )
    .await?;

    let released = action("released", "r2");
    let lease = grant(&store, &released).await?;
    store.release(&released, &lease).await?;
    expect_outcome(
        &fx.store().await?,
        &released,
        Outcome::Uncertain,
        "intent whose lease was released",
    )
    .await?;

    let safe = action("safe", "r3").with_retry_safety(RetrySafety::Safe);
    let first = grant(&store, &safe).await?;
    store.release(&safe, &first).await?;
    let again = grant(&fx.store().await?, &safe)
        .await
        .map_err(|f| Failure::new(format!("retry-safe action after release: {f}")))?;
    ensure!(
        again.fence > first.fence,
        "re-grant of a retry-safe action reused {:?}",
        again.fence
    );

    let declared_then = action("declared", "r4").with_retry_safety(RetrySafety::Safe);
    let lease = grant(&store, &declared_then).await?;
    store.release(&declared_then, &lease).await?;
    let undeclared_now = action("declared", "r4");
    expect_outcome(
        &fx.store().await?,
        &undeclared_now,
        Outcome::Uncertain,
        "granted as retry-safe, asked again without the declaration",
    )
    .await?;
    Ok(())
}

/// Rule 7: a resource leased by another live holder → Contended (not an
/// error, no fence); retryable once the holder is gone.
pub async fn rule_07_busy_resource_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    expect_outcome(
        &fx.store().await?,
        &b,
        Outcome::Contended,
        "resource held by another key",
    )
    .await?;
    store.release(&a, &la).await?;
    let lb = grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("Contended was not retryable: {f}")))?;
    ensure!(
        lb.fence == Fence(la.fence.0 + 1),
        "the Contended answer issued a fence: next grant has {:?} after {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}

/// Rule 8: a grant's fence = highest ever issued + 1, its lease describes
/// the grant, and the execution intent exists as soon as the grant does.
pub async fn rule_08_grant_fence_and_intent(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let t0 = fx.clock().now();
    let la = grant(&store, &a).await?;
    ensure!(
        la.fence == Fence(1),
        "first grant on a fresh resource: {:?}",
        la.fence
    );
    ensure!(la.resource == "r", "lease resource {:?}", la.resource);
    ensure!(la.holder == "a", "lease holder {:?}", la.holder);
    ensure!(
        la.expires_at == t0 + TTL,
        "lease expires at {:?}, expected now + TTL = {:?}",
        la.expires_at,
        t0 + TTL
    );
    store.release(&a, &la).await?;
    let lb = grant(&store, &b).await?;
    ensure!(
        lb.fence == Fence(2),
        "grant after a release: {:?}, expected fence 2",
        lb.fence
    );
    // The intent is there right after the grant: in flight, then uncertain.
    expect_outcome(
        &fx.store().await?,
        &b,
        Outcome::Contended,
        "right after the grant",
    )
    .await?;
    fx.advance(PAST_TTL);
    expect_outcome(
        &fx.store().await?,
        &b,
        Outcome::Uncertain,
        "after the grant's lease expired",
    )
    .await?;
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(3),
        "grant after expiry: {:?}, expected fence 3",
        lc.fence
    );
    Ok(())
}

/// Rule 9: fences per resource strictly increase and are never reused, across
/// release, completion, expiry, takeover and abandon (each step by a fresh client).
pub async fn rule_09_fences_never_reused(fx: Fixture) -> CheckResult {
    let mut fences = Vec::new();
    let k = |i: usize| action(&format!("k{i}"), "r");

    let store = fx.store().await?;
    let l1 = grant(&store, &k(1)).await?;
    store.release(&k(1), &l1).await?;
    fences.push(l1.fence);

    let store = fx.store().await?;
    let l2 = grant(&store, &k(2)).await?;
    store.complete(&k(2), &l2, result("2")).await?;
    fences.push(l2.fence);
    fx.advance(PAST_TTL);

    let store = fx.store().await?;
    let l3 = grant(&store, &k(3)).await?;
    fences.push(l3.fence);
    fx.advance(PAST_TTL);

    let store = fx.store().await?;
    let l4 = grant(&store, &k(4)).await?;
    store.abandon(&k(4), &l4, "conformance").await?;
    fences.push(l4.fence);

    let store = fx.store().await?;
    let l5 = grant(&store, &k(5)).await?;
    fences.push(l5.fence);

    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences on one resource did not strictly increase: {fences:?}"
    );
    Ok(())
}

/// Rule 10: an expired lease is taken over by another action on the same
/// resource, with a higher fence.
pub async fn rule_10_takeover_after_expiry(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    expect_outcome(&store, &b, Outcome::Contended, "before expiry").await?;
    fx.advance(PAST_TTL);
    let lb = grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("takeover after expiry: {f}")))?;
    ensure!(
        lb.fence > la.fence,
        "takeover fence {:?} is not above {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}

// ---------------------------------------------------------------- complete

/// Rule 11: complete with the current fence records the result; the key is
/// completed (later acquires replay it). This adapter's `complete` also frees
/// the resource (documented; the runner relies on it).
pub async fn rule_11_complete_records_result(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    let stored = store.complete(&a, &la, result("r1")).await?;
    ensure!(stored == result("r1"), "complete returned {stored:?}");
    expect_replayed(&fx.store().await?, &a, "r1", "after complete").await?;
    fx.advance(PAST_TTL);
    expect_replayed(
        &fx.store().await?,
        &a,
        "r1",
        "after complete, past the lease",
    )
    .await?;
    let lb = grant(&fx.store().await?, &b).await?;
    ensure!(
        lb.fence > la.fence,
        "fence {:?} after {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}

/// Rule 12: a second complete returns the FIRST result.
pub async fn rule_12_complete_first_result_wins(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let la = grant(&store, &a).await?;
    store.complete(&a, &la, result("first")).await?;
    let second = store.complete(&a, &la, result("second")).await?;
    ensure!(
        second == result("first"),
        "second complete returned {second:?}, expected the first result"
    );
    expect_replayed(&fx.store().await?, &a, "first", "after two completes").await
}

/// Rule 13: complete with a stale fence (resource taken over) → fence-stale,
/// nothing recorded.
pub async fn rule_13_complete_stale_fence(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.complete(&a, &la, result("late")).await,
        SideEffectError::FenceStale,
        "complete after a takeover"
    );
    let seen = store.acquire(&a, TTL).await?;
    ensure!(
        seen.outcome != Outcome::Replayed && seen.outcome != Outcome::Applied,
        "the stale complete was recorded: acquire → {seen:?}"
    );
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the new holder's complete").await?;
    let seen = fx.store().await?.acquire(&a, TTL).await?;
    ensure!(
        seen.outcome == Outcome::Uncertain,
        "the taken-over key reads {seen:?}, expected Uncertain"
    );
    Ok(())
}

/// Rule 14: a released lease (same generation, no holder), a forged token
/// or another key's lease → fence-stale: all three parts are checked together.
pub async fn rule_14_complete_released_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r2"));
    let la = grant(&store, &a).await?;
    let forged = Lease {
        token: "forged".into(),
        ..la.clone()
    };
    expect_err!(
        store.complete(&a, &forged, result("x")).await,
        SideEffectError::FenceStale,
        "complete with the current fence but a forged token"
    );
    let lb = grant(&store, &b).await?;
    let a_on_r2 = action("a", "r2");
    expect_err!(
        store.complete(&a_on_r2, &lb, result("x")).await,
        SideEffectError::FenceStale,
        "complete with another key's lease"
    );
    store.release(&a, &la).await?;
    expect_err!(
        store.complete(&a, &la, result("x")).await,
        SideEffectError::FenceStale,
        "complete with a released lease"
    );
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "after the refused completes",
    )
    .await?;
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the other key").await
}

/// Rule 15: a lease for another resource than the action's → refused.
pub async fn rule_15_complete_other_resource(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r1"), action("b", "r2"));
    let la = grant(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.complete(&a, &lb, result("x")).await,
        SideEffectError::FenceStale,
        "complete of a (on r1) with b's lease on r2"
    );
    let relabeled = Lease {
        resource: "r2".into(),
        ..la.clone()
    };
    expect_err!(
        store.complete(&a, &relabeled, result("x")).await,
        SideEffectError::FenceStale,
        "complete with a lease naming another resource"
    );
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Contended,
        "after the refused completes",
    )
    .await?;
    store.complete(&a, &la, result("a")).await?;
    expect_replayed(&store, &a, "a", "the right lease still completes").await
}

// ---------------------------------------------------------------- release

/// Rule 16: release frees the resource only: the key is not done and its
/// intent stays (the key reads Uncertain until abandoned or reconciled).
pub async fn rule_16_release_frees_resource_only(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    store.release(&a, &la).await?;
    let lb = grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("release did not free the resource: {f}")))?;
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "released key, resource held by another",
    )
    .await?;
    store.complete(&b, &lb, result("b")).await?;
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "released key, resource free",
    )
    .await?;
    Ok(())
}

/// Rule 17: a stale release changes nothing of the newer holder; fence-stale.
pub async fn rule_17_stale_release(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.release(&a, &la).await,
        SideEffectError::FenceStale,
        "release with a taken-over lease"
    );
    expect_outcome(
        &fx.store().await?,
        &c,
        Outcome::Contended,
        "after the stale release",
    )
    .await?;
    store
        .renew(&b, &lb, TTL)
        .await
        .map_err(|e| Failure::new(format!("the newer holder lost its lease: {e}")))?;
    Ok(())
}

// ---------------------------------------------------------------- renew

/// Rule 18: renew with the current fence and an unexpired lease pushes the
/// expiry to now + TTL.
pub async fn rule_18_renew_extends(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let t0 = fx.clock().now();
    let la = grant(&store, &a).await?;
    fx.advance(Duration::from_secs(8));
    let renewed = store.renew(&a, &la, TTL).await?;
    let expected = t0 + Duration::from_secs(8) + TTL;
    ensure!(
        renewed.expires_at == expected,
        "renewed lease expires at {:?}, expected {expected:?}",
        renewed.expires_at
    );
    ensure!(renewed.fence == la.fence, "renew changed the fence");
    fx.advance(Duration::from_secs(5));
    expect_outcome(
        &fx.store().await?,
        &b,
        Outcome::Contended,
        "past the original expiry, within the renewal",
    )
    .await?;
    fx.advance(Duration::from_secs(6));
    grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("after the renewed expiry: {f}")))?;
    Ok(())
}

/// Rule 19: renew after a takeover → lease-lost, nothing changed.
pub async fn rule_19_renew_after_takeover(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.renew(&a, &la, TTL).await,
        SideEffectError::LeaseLost,
        "renew after a takeover"
    );
    expect_outcome(
        &fx.store().await?,
        &c,
        Outcome::Contended,
        "after the refused renew",
    )
    .await?;
    store
        .renew(&b, &lb, TTL)
        .await
        .map_err(|e| Failure::new(format!("the newer holder lost its lease: {e}")))?;
    Ok(())
}

/// Rule 20: renew after expiry is refused even if nobody took over.
pub async fn rule_20_renew_after_expiry(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    expect_err!(
        store.renew(&a, &la, TTL).await,
        SideEffectError::LeaseLost,
        "renew of an expired lease nobody took over"
    );
    grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("the refused renew extended the lease: {f}")))?;
    Ok(())
}

/// Rule 21: renew's check and extension are one atomic step: a renew racing a
/// takeover (by a client whose clock already sees the lease expired) never
/// lets both succeed.
pub async fn rule_21_renew_atomic(fx: Fixture) -> CheckResult {
    for round in 0..12 {
        let resource = format!("r{round}");
        let (a, b) = (
            action(&format!("a{round}"), &resource),
            action(&format!("b{round}"), &resource),
        );
        let holder = fx.store().await?;
        let la = grant(&holder, &a).await?;
        let taker = fx.store_with_clock(fx.skewed_clock(PAST_TTL)).await?;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let renew = {
            let barrier = barrier.clone();
            let (a, la) = (a.clone(), la.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                holder.renew(&a, &la, TTL * 2).await
            })
        };
        let take = tokio::spawn(async move {
            barrier.wait().await;
            taker.acquire(&b, TTL).await
        });
        let renewed = join(renew).await?;
        let taken = join(take).await??;
        let renew_ok = match renewed {
            Ok(_) => true,
            Err(SideEffectError::LeaseLost) => false,
            Err(other) => return Err(other.into()),
        };
        let took_over = taken.outcome == Outcome::Applied;
        ensure!(
            !(renew_ok && took_over),
            "round {round}: the renew succeeded AND another client took the resource over (two live holders)"
        );
        ensure!(
            renew_ok || took_over,
            "round {round}: neither the renew nor the takeover succeeded ({taken:?})"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- abandon

/// Rule 22: abandon drops the intent and releases the own lease; the key can
/// be acquired again (Applied, higher fence).
pub async fn rule_22_abandon_allows_rerun(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let first = grant(&store, &a).await?;
    store.abandon(&a, &first, "nothing applied").await?;
    let again = grant(&fx.store().await?, &a)
        .await
        .map_err(|f| Failure::new(format!("after abandon: {f}")))?;
    ensure!(
        again.fence > first.fence,
        "re-grant reused {:?}",
        again.fence
    );
    Ok(())
}

/// Rule 23: abandon with a stale lease drops nothing of the newer holder's lease.
pub async fn rule_23_abandon_stale_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    let lb = grant(&store, &b).await?;
    match store.abandon(&a, &la, "late").await {
        Ok(()) | Err(SideEffectError::FenceStale) => {}
        Err(other) => return Err(other.into()),
    }
    expect_outcome(
        &fx.store().await?,
        &c,
        Outcome::Contended,
        "after the stale abandon",
    )
    .await?;
    store
        .renew(&b, &lb, TTL)
        .await
        .map_err(|e| Failure::new(format!("the newer holder lost its lease: {e}")))?;
    store.complete(&b, &lb, result("b")).await?;
    Ok(())
}

// ---------------------------------------------------------------- mark_uncertain

/// Rule 24: after mark_uncertain the key reads Uncertain; the mark is per key:
/// the resource may be leased by other actions meanwhile.
pub async fn rule_24_uncertain_per_key(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    make_uncertain(&store, &a).await?;
    let lb = grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("another action on the resource: {f}")))?;
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "while another action holds the resource",
    )
    .await?;
    store.complete(&b, &lb, result("b")).await?;
    fx.advance(PAST_TTL);
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "later, resource free",
    )
    .await?;
    Ok(())
}

/// Rule 25: mark_uncertain is idempotent.
pub async fn rule_25_mark_uncertain_idempotent(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let la = grant(&store, &a).await?;
    store.mark_uncertain(&a, &la, "once").await?;
    store
        .mark_uncertain(&a, &la, "twice")
        .await
        .map_err(|e| Failure::new(format!("second mark_uncertain: {e}")))?;
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "after two marks",
    )
    .await?;
    Ok(())
}

/// Rule 26: mark_uncertain with a stale fence is refused: a late holder must
/// not mark a newer holder's completed work unknown.
pub async fn rule_26_mark_uncertain_stale_fence(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.mark_uncertain(&a, &la, "late").await,
        SideEffectError::FenceStale,
        "mark_uncertain after a takeover"
    );
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the newer holder's work").await?;

    // The same key granted again (declared retry-safe) and completed by the
    // newer holder: the old holder's mark must not make it unknown.
    let k = action("k", "r2").with_retry_safety(RetrySafety::Safe);
    let old = grant(&store, &k).await?;
    fx.advance(PAST_TTL);
    let new = grant(&store, &k).await?;
    store.complete(&k, &new, result("new")).await?;
    expect_err!(
        store.mark_uncertain(&k, &old, "late").await,
        SideEffectError::FenceStale,
        "late mark_uncertain of a key the newer holder completed"
    );
    expect_replayed(&fx.store().await?, &k, "new", "after the refused mark").await
}

/// Rule 27: marking and clearing the intent are one txn: whichever txn of
/// mark_uncertain fails, the key is never left runnable.
pub async fn rule_27_mark_uncertain_one_txn(fx: Fixture) -> CheckResult {
    for nth in 1..=3 {
        let a = action(&format!("a{nth}"), &format!("r{nth}"));
        let faulty = Arc::new(FaultyBackend::new(fx.backend().await?, nth as u64));
        let store = fx.store_over(faulty.clone());
        let la = grant(&store, &a).await?;
        // The nth txn of mark_uncertain is refused before reaching the store.
        faulty.nth(Target::Txn, nth as u64, Fault::Refuse);
        let marked = store.mark_uncertain(&a, &la, "conformance").await;
        let fired = faulty.fired() > 0;
        faulty.heal();
        if marked.is_err() {
            ensure!(
                fired,
                "mark_uncertain failed without the injected fault: {marked:?}"
            );
        }
        let clean = fx.store().await?;
        let now = clean.acquire(&a, TTL).await?;
        ensure!(
            matches!(now.outcome, Outcome::Contended | Outcome::Uncertain),
            "txn {nth} of mark_uncertain failed ({marked:?}): the key reads {now:?}"
        );
        fx.advance(PAST_TTL);
        expect_outcome(
            &clean,
            &a,
            Outcome::Uncertain,
            &format!("txn {nth} of mark_uncertain failed ({marked:?}), lease expired"),
        )
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------- resolve

/// Rule 28: resolve applied = true → key completed with the given result; acquire → Replayed.
pub async fn rule_28_resolve_applied(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    make_uncertain(&store, &a).await?;
    let resolved = store
        .resolve_uncertain(&a, &Resolution::applied("r1", "downstream has it"))
        .await?;
    ensure!(
        resolved
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("r1"))
            },
        "resolution answered {resolved:?}"
    );
    expect_replayed(&fx.store().await?, &a, "r1", "after resolve(applied)").await
}

/// Rule 29: resolve applied = false → mark cleared; acquire → Applied.
pub async fn rule_29_resolve_not_applied(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let first = make_uncertain(&store, &a).await?;
    store
        .resolve_uncertain(&a, &Resolution::not_applied("downstream never saw it"))
        .await?;
    let again = grant(&fx.store().await?, &a)
        .await
        .map_err(|f| Failure::new(format!("after resolve(not applied): {f}")))?;
    ensure!(
        again.fence > first.fence,
        "re-grant reused {:?}",
        again.fence
    );
    Ok(())
}

/// Rule 30: the first resolution wins; a second one does not overwrite it.
pub async fn rule_30_first_resolution_wins(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    store
        .resolve_uncertain(&a, &Resolution::applied("one", "first"))
        .await?;
    let second = store
        .resolve_uncertain(&a, &Resolution::applied("two", "second"))
        .await?;
    ensure!(
        second.result == Some(result("one")),
        "second resolution answered {second:?}"
    );
    store
        .resolve_uncertain(&a, &Resolution::not_applied("third"))
        .await?;
    expect_replayed(&fx.store().await?, &a, "one", "after three resolutions").await?;

    let b = action("b", "r2");
    make_uncertain(&store, &b).await?;
    store
        .resolve_uncertain(&b, &Resolution::not_applied("first"))
        .await?;
    expect_err!(
        store
            .resolve_uncertain(&b, &Resolution::applied("late", "second"))
            .await,
        SideEffectError::NotUncertain,
        "second resolution after a cleared mark"
    );
    grant(&fx.store().await?, &b)
        .await
        .map_err(|f| Failure::new(format!("the second resolution overwrote the first: {f}")))?;
    Ok(())
}

/// Rule 31: resolving a key that is not uncertain: completed → Replayed with
/// the stored result; otherwise not-uncertain, nothing changed.
pub async fn rule_31_resolve_not_uncertain(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    expect_err!(
        store
            .resolve_uncertain(&action("never", "r1"), &Resolution::applied("x", "?"))
            .await,
        SideEffectError::NotUncertain,
        "resolve of a key never seen"
    );
    let done = action("done", "r2");
    let lease = grant(&store, &done).await?;
    store.complete(&done, &lease, result("c")).await?;
    for resolution in [
        Resolution::applied("other", "?"),
        Resolution::not_applied("?"),
    ] {
        let answer = store.resolve_uncertain(&done, &resolution).await?;
        ensure!(
            answer
                == Execution {
                    outcome: Outcome::Replayed,
                    result: Some(result("c"))
                },
            "resolve of a completed key answered {answer:?}"
        );
    }
    expect_replayed(&store, &done, "c", "after resolving a completed key").await?;

    let running = action("running", "r3");
    let lease = grant(&store, &running).await?;
    expect_err!(
        store
            .resolve_uncertain(&running, &Resolution::not_applied("?"))
            .await,
        SideEffectError::NotUncertain,
        "resolve of a key in flight"
    );
    store
        .complete(&running, &lease, result("ran"))
        .await
        .map_err(|e| Failure::new(format!("the in-flight holder was disturbed: {e}")))?;
    Ok(())
}

/// Rule 32: resolving checks no fence: a reconciler needs no lease (the
/// resource may be held by someone else, the original lease long gone).
pub async fn rule_32_resolve_without_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    make_uncertain(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    fx.store()
        .await?
        .resolve_uncertain(&a, &Resolution::applied("x", "found downstream"))
        .await?;
    expect_replayed(
        &fx.store().await?,
        &a,
        "x",
        "resolved while another holds the resource",
    )
    .await?;
    store.complete(&b, &lb, result("b")).await?;

    // An attempt whose holder died (lease expired, resource taken over).
    let (dead, c) = (action("dead", "r2"), action("c", "r2"));
    grant(&store, &dead).await?;
    fx.advance(PAST_TTL);
    let lc = grant(&store, &c).await?;
    fx.store()
        .await?
        .resolve_uncertain(&dead, &Resolution::not_applied("not downstream"))
        .await?;
    store.complete(&c, &lc, result("c")).await?;
    grant(&fx.store().await?, &dead)
        .await
        .map_err(|f| Failure::new(format!("after resolving a dead attempt: {f}")))?;
    Ok(())
}

// ---------------------------------------------------------------- reconcile claims

/// Rule 33: at most one reconciler per key at a time; a claim expires.
pub async fn rule_33_one_reconciler(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    let first: Option<ReconcileClaim> = fx.store().await?.begin_reconcile(&a, TTL).await?;
    let Some(first) = first else {
        return Err(Failure::new("the first reconciler got no claim"));
    };
    let second = fx.store().await?.begin_reconcile(&a, TTL).await?;
    ensure!(
        second.is_none(),
        "a second reconciler got a claim: {second:?}"
    );
    fx.advance(PAST_TTL);
    let third = fx.store().await?.begin_reconcile(&a, TTL).await?;
    let Some(third) = third else {
        return Err(Failure::new("an expired claim still blocks the key"));
    };
    ensure!(
        third.holder != first.holder,
        "the new claim reuses the old holder"
    );

    let k = action("k", "r2");
    make_uncertain(&store, &k).await?;
    const RACERS: usize = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for _ in 0..RACERS {
        let reconciler = fx.store().await?;
        let (barrier, k) = (barrier.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            reconciler.begin_reconcile(&k, TTL).await
        }));
    }
    let mut claims = 0;
    for task in tasks {
        if join(task).await??.is_some() {
            claims += 1;
        }
    }
    ensure!(
        claims == 1,
        "{claims} of {RACERS} racing reconcilers got a claim"
    );
    Ok(())
}

/// Rule 34: an owned resolve by anyone but the current, unexpired reconciler
/// → reconcile-lost, nothing changed; the check and the resolution are one txn.
pub async fn rule_34_owned_resolve(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    let old = store
        .begin_reconcile(&a, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
    fx.advance(PAST_TTL);
    let current = store
        .begin_reconcile(&a, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim after the old one expired"))?;
    expect_err!(
        store
            .resolve_uncertain_owned(&a, &Resolution::applied("old", "?"), &old.holder)
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve by a replaced reconciler"
    );
    expect_err!(
        store
            .resolve_uncertain_owned(&a, &Resolution::applied("nobody", "?"), "nobody")
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve by a stranger"
    );
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "after refused owned resolves",
    )
    .await?;
    let resolved = store
        .resolve_uncertain_owned(&a, &Resolution::applied("new", "checked"), &current.holder)
        .await?;
    ensure!(
        resolved.result == Some(result("new")),
        "owned resolve answered {resolved:?}"
    );
    expect_replayed(&fx.store().await?, &a, "new", "after the owned resolve").await?;

    let b = action("b", "r2");
    make_uncertain(&store, &b).await?;
    let lapsed = store
        .begin_reconcile(&b, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
    fx.advance(PAST_TTL);
    expect_err!(
        store
            .resolve_uncertain_owned(&b, &Resolution::not_applied("?"), &lapsed.holder)
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve with an expired claim"
    );
    expect_outcome(
        &fx.store().await?,
        &b,
        Outcome::Uncertain,
        "after the refused owned resolve",
    )
    .await?;

    // Race: the claim holder resolves while another reconciler (whose clock
    // sees the claim expired) claims the key: never both.
    for round in 0..8 {
        let k = action(&format!("k{round}"), &format!("rk{round}"));
        make_uncertain(&store, &k).await?;
        let claim = store
            .begin_reconcile(&k, TTL)
            .await?
            .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
        let rival = fx.store_with_clock(fx.skewed_clock(PAST_TTL)).await?;
        let owner = fx.store().await?;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let resolve = {
            let (barrier, k) = (barrier.clone(), k.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                owner
                    .resolve_uncertain_owned(&k, &Resolution::applied("owner", "?"), &claim.holder)
                    .await
            })
        };
        let claim_again = tokio::spawn(async move {
            barrier.wait().await;
            rival.begin_reconcile(&k, TTL).await
        });
        let resolved = match join(resolve).await? {
            Ok(_) => true,
            Err(SideEffectError::ReconcileLost) => false,
            Err(other) => return Err(other.into()),
        };
        let claimed = match join(claim_again).await? {
            Ok(claim) => claim.is_some(),
            Err(SideEffectError::NotUncertain) => false,
            Err(other) => return Err(other.into()),
        };
        ensure!(
            !(resolved && claimed),
            "round {round}: the owner resolved AND a rival claimed the key"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- Runner

type ApplyResult = Result<EffectResult, std::io::Error>;

fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// An apply that records it was called and returns `text`.
fn recording_apply(
    called: &Arc<AtomicBool>,
    text: &'static str,
) -> impl FnOnce(Lease) -> BoxFuture<'static, ApplyResult> {
    let called = called.clone();
    move |_lease| {
        Box::pin(async move {
            called.store(true, Ordering::SeqCst);
            Ok(result(text))
        })
    }
}

fn failing_apply(_lease: Lease) -> BoxFuture<'static, ApplyResult> {
    Box::pin(async { Err(io_error("remote timed out")) })
}

/// Rule 35: no store → no-store error (never a silent success).
pub async fn rule_35_runner_no_store(_fx: Fixture) -> CheckResult {
    let runner = Runner::from_option(None);
    let a = action("a", "r");
    let called = flag();
    expect_err!(
        runner.execute(&a, TTL, recording_apply(&called, "x")).await,
        SideEffectError::NoStore,
        "execute without a store"
    );
    expect_err!(
        runner.run(&a, TTL, recording_apply(&called, "x")).await,
        SideEffectError::NoStore,
        "run without a store"
    );
    expect_err!(
        runner.reconcile(&a, Resolution::not_applied("?")).await,
        SideEffectError::NoStore,
        "reconcile without a store"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply was called without a store"
    );
    Ok(())
}

/// Rule 36: a completed key → the effect is not called; the stored result comes back, Replayed.
pub async fn rule_36_runner_replays_completed(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let first = runner
        .execute(&a, TTL, recording_apply(&flag(), "x"))
        .await?;
    ensure!(
        first
            == Execution {
                outcome: Outcome::Applied,
                result: Some(result("x"))
            },
        "first run: {first:?}"
    );
    let store = fx.store().await?;
    let lb = grant(&store, &b).await?;
    let called = flag();
    let again = fx
        .runner()
        .await?
        .execute(&a, TTL, recording_apply(&called, "y"))
        .await?;
    ensure!(
        !called.load(Ordering::SeqCst),
        "the effect ran again for a completed key"
    );
    ensure!(
        again
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("x"))
            },
        "replay (resource held by another): {again:?}"
    );
    store.complete(&b, &lb, result("b")).await?;
    Ok(())
}

/// Rule 37: Contended → outcome Contended, no error, effect not called.
pub async fn rule_37_runner_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let lb = grant(&store, &b).await?;
    let called = flag();
    let runner = fx.runner().await?;
    let contended = runner
        .execute(&a, TTL, recording_apply(&called, "x"))
        .await?;
    ensure!(
        contended
            == Execution {
                outcome: Outcome::Contended,
                result: None
            },
        "busy resource: {contended:?}"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "the effect ran on a busy resource"
    );
    store.abandon(&b, &lb, "done").await?;
    let later = runner
        .execute(&a, TTL, recording_apply(&called, "x"))
        .await?;
    ensure!(
        later.outcome == Outcome::Applied,
        "retry after the holder left: {later:?}"
    );
    Ok(())
}

/// Rule 38: prepare fails → nothing applied, the attempt is abandoned, the
/// same key can run again at once.
pub async fn rule_38_runner_prepare_fails(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r");
    let called = flag();
    let apply_called = called.clone();
    let failed = runner
        .execute_with(
            &a,
            TTL,
            || async { Err::<(), _>(io_error("could not build the request")) },
            move |(), _lease| async move {
                apply_called.store(true, Ordering::SeqCst);
                Ok::<_, std::io::Error>(result("x"))
            },
        )
        .await;
    expect_err!(
        failed,
        SideEffectError::PrepareFailed { .. },
        "prepare failure"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply ran after prepare failed"
    );
    let again = runner
        .execute(&a, TTL, recording_apply(&called, "y"))
        .await?;
    ensure!(
        again
            == Execution {
                outcome: Outcome::Applied,
                result: Some(result("y"))
            },
        "rerun after a prepare failure: {again:?}"
    );
    Ok(())
}

/// Rule 39: the ownership check (renew) between prepare and apply fails →
/// apply not called; Contended with lease-lost; the action can be retried.
pub async fn rule_39_runner_ownership_check(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let rival = fx.store().await?;
    let rival_lease: Arc<Mutex<Option<Lease>>> = Arc::default();
    let called = flag();
    let outcome = {
        let (clock, rival, slot, b) = (
            fx.clock().clone(),
            rival.clone(),
            rival_lease.clone(),
            b.clone(),
        );
        let apply_called = called.clone();
        runner
            .execute_with(
                &a,
                TTL,
                move || async move {
                    // A slow prepare: the lease expires and another action takes the resource.
                    clock.advance(PAST_TTL);
                    let taken = rival.acquire(&b, TTL).await;
                    if let Ok(Acquired {
                        lease: Some(lease), ..
                    }) = &taken
                    {
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease.clone());
                    }
                    Ok::<_, std::io::Error>(())
                },
                move |(), _lease| async move {
                    apply_called.store(true, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(result("x"))
                },
            )
            .await
    };
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply ran after the lease was taken over"
    );
    let lb = rival_lease
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| Failure::new("the rival could not take over the expired lease"))?;
    match &outcome {
        Err(e @ SideEffectError::LeaseLost) if e.outcome() == Some(Outcome::Contended) => {}
        other => {
            return Err(Failure::new(format!(
                "ownership check failed: expected Err(LeaseLost) meaning Contended, got {other:?}"
            )))
        }
    }
    rival.complete(&b, &lb, result("b")).await?;
    let retried = runner
        .execute(&a, TTL, recording_apply(&called, "x"))
        .await?;
    ensure!(
        retried.outcome == Outcome::Applied,
        "retrying the whole action after lease-lost: {retried:?}"
    );
    Ok(())
}

/// Rule 40: apply receives the lease, with its fence (the current grant).
pub async fn rule_40_runner_apply_gets_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (z, a) = (action("z", "r"), action("a", "r"));
    let lz = grant(&store, &z).await?;
    store.abandon(&z, &lz, "warm-up").await?;
    let seen: Arc<Mutex<Option<(Lease, bool)>>> = Arc::default();
    let runner = fx.runner().await?;
    {
        let (seen, store, a2) = (seen.clone(), store.clone(), a.clone());
        runner
            .execute(&a, TTL, move |lease| async move {
                let current = store.renew(&a2, &lease, TTL).await.is_ok();
                *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((lease, current));
                Ok::<_, std::io::Error>(result("ok"))
            })
            .await?;
    }
    let (lease, current) = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| Failure::new("apply was not called"))?;
    ensure!(
        lease.resource == "r" && lease.holder == "a",
        "apply got {lease:?}"
    );
    ensure!(
        lease.fence == Fence(lz.fence.0 + 1),
        "apply got {:?}, expected the grant's fence {}",
        lease.fence,
        lz.fence.0 + 1
    );
    ensure!(
        current,
        "the lease given to apply is not the current one (renew refused it)"
    );
    Ok(())
}

/// Rule 41: apply fails on a retry-safe action → attempt abandoned; retryable at once.
pub async fn rule_41_runner_apply_fails_safe(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r").with_retry_safety(RetrySafety::Safe);
    expect_err!(
        runner.execute(&a, TTL, failing_apply).await,
        SideEffectError::ApplyFailed { .. },
        "apply failure of a retry-safe action"
    );
    let again = runner
        .execute(&a, TTL, recording_apply(&flag(), "z"))
        .await?;
    ensure!(
        again
            == Execution {
                outcome: Outcome::Applied,
                result: Some(result("z"))
            },
        "retry of a retry-safe action: {again:?}"
    );
    Ok(())
}

/// Rule 42: apply fails with retry safety Unknown (default) or Unsafe → key
/// Uncertain, outcome-unknown error; the resource is released.
pub async fn rule_42_runner_apply_fails_unknown(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    for safety in [RetrySafety::Unknown, RetrySafety::Unsafe] {
        let resource = format!("r-{safety}");
        let a = action(&format!("a-{safety}"), &resource).with_retry_safety(safety);
        let failed = runner.execute(&a, TTL, failing_apply).await;
        match &failed {
            Err(e @ SideEffectError::OutcomeUnknown { .. })
                if e.outcome() == Some(Outcome::Uncertain) => {}
            other => {
                return Err(Failure::new(format!(
                    "apply failure ({safety}): expected Err(OutcomeUnknown), got {other:?}"
                )))
            }
        }
        expect_outcome(
            &fx.store().await?,
            &a,
            Outcome::Uncertain,
            &format!("after an apply failure ({safety})"),
        )
        .await?;
        let called = flag();
        let again = runner
            .execute(&a, TTL, recording_apply(&called, "x"))
            .await?;
        ensure!(
            again.outcome == Outcome::Uncertain && !called.load(Ordering::SeqCst),
            "rerun of an uncertain key ({safety}): {again:?}, apply called: {}",
            called.load(Ordering::SeqCst)
        );
        grant(
            &fx.store().await?,
            &action(&format!("other-{safety}"), &resource),
        )
        .await
        .map_err(|f| Failure::new(format!("resource not released ({safety}): {f}")))?;
    }
    Ok(())
}

/// A store whose `complete` always fails with `Unavailable` (before touching anything).
#[derive(Debug)]
struct CompleteFails(Arc<dyn SideEffectStore>);

#[async_trait]
impl SideEffectStore for CompleteFails {
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError> {
        self.0.acquire(action, ttl).await
    }
    async fn complete(
        &self,
        _action: &Action,
        _lease: &Lease,
        _result: EffectResult,
    ) -> Result<EffectResult, SideEffectError> {
        Err(SideEffectError::Store(Error::Unavailable {
            message: "injected complete failure (conformance)".into(),
            source: None,
        }))
    }
    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError> {
        self.0.release(action, lease).await
    }
    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError> {
        self.0.renew(action, lease, ttl).await
    }
    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.mark_uncertain(action, lease, reason).await
    }
    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError> {
        self.0.resolve_uncertain(action, resolution).await
    }
    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.abandon(action, lease, reason).await
    }
    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        self.0.begin_reconcile(action, ttl).await
    }
    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError> {
        self.0
            .resolve_uncertain_owned(action, resolution, holder)
            .await
    }
}

/// Rule 43: apply succeeds but complete fails → key Uncertain, outcome-unknown error.
pub async fn rule_43_runner_complete_fails(fx: Fixture) -> CheckResult {
    let runner = Runner::new(Arc::new(CompleteFails(fx.store().await?)));
    let a = action("a", "r");
    let called = flag();
    let failed = runner.execute(&a, TTL, recording_apply(&called, "x")).await;
    ensure!(called.load(Ordering::SeqCst), "apply was not called");
    match &failed {
        Err(e @ SideEffectError::OutcomeUnknown { .. })
            if e.outcome() == Some(Outcome::Uncertain) => {}
        other => {
            return Err(Failure::new(format!(
                "complete failed after apply: expected Err(OutcomeUnknown), got {other:?}"
            )))
        }
    }
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "after a failed complete",
    )
    .await?;
    fx.advance(PAST_TTL);
    expect_outcome(
        &fx.store().await?,
        &a,
        Outcome::Uncertain,
        "after a failed complete, later",
    )
    .await?;
    Ok(())
}

/// Rule 44: `reconcile` resolves through rules 28–31; `run` returns only the result.
pub async fn rule_44_runner_reconcile_and_run(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r1");
    let _ = runner.execute(&a, TTL, failing_apply).await;
    let resolved = runner
        .reconcile(&a, Resolution::applied("r", "downstream has it"))
        .await?;
    ensure!(
        resolved
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("r"))
            },
        "reconcile(applied): {resolved:?}"
    );
    let called = flag();
    let ran = runner
        .run(&a, TTL, recording_apply(&called, "again"))
        .await?;
    ensure!(
        ran == Some(result("r")) && !called.load(Ordering::SeqCst),
        "run after reconcile(applied): {ran:?}"
    );
    let second = runner
        .reconcile(&a, Resolution::not_applied("late"))
        .await?;
    ensure!(
        second.result == Some(result("r")),
        "second reconcile: {second:?}"
    );

    let b = action("b", "r2");
    let _ = runner.execute(&b, TTL, failing_apply).await;
    expect_err!(
        runner.run(&b, TTL, recording_apply(&called, "b")).await,
        SideEffectError::OutcomeUnknown { .. },
        "run of an uncertain key"
    );
    runner
        .reconcile(&b, Resolution::not_applied("not downstream"))
        .await?;
    let ran = runner.run(&b, TTL, recording_apply(&flag(), "b")).await?;
    ensure!(
        ran == Some(result("b")),
        "run after reconcile(not applied): {ran:?}"
    );

    expect_err!(
        runner
            .reconcile(&action("fresh", "r3"), Resolution::not_applied("?"))
            .await,
        SideEffectError::NotUncertain,
        "reconcile of a key that never failed"
    );

    let store = fx.store().await?;
    let holder = action("holder", "r4");
    let lease = grant(&store, &holder).await?;
    let called = flag();
    let contended = runner
        .run(&action("d", "r4"), TTL, recording_apply(&called, "d"))
        .await?;
    ensure!(
        contended.is_none() && !called.load(Ordering::SeqCst),
        "run on a busy resource: {contended:?}"
    );
    store.complete(&holder, &lease, result("h")).await?;
    Ok(())
}

// ---------------------------------------------------------------- FencedSink

/// Rule 45: a fence lower than the highest seen → fence-stale, no write at all.
pub async fn rule_45_sink_lower_fence_rejected(fx: Fixture) -> CheckResult {
    let backend = fx.backend().await?;
    let sink = fx.sink().await?;
    sink.write_fenced(
        "acct",
        Fence(5),
        vec![Mutation::put("acct/balance", "five")],
    )
    .await?;
    let before = backend.get("acct/balance").await?;
    expect_err!(
        sink.write_fenced(
            "acct",
            Fence(3),
            vec![
                Mutation::put("acct/balance", "three"),
                Mutation::put("acct/other", "x"),
            ],
        )
        .await,
        SideEffectError::FenceStale,
        "write with a lower fence"
    );
    ensure!(
        backend.get("acct/balance").await? == before,
        "the stale write changed the data"
    );
    ensure!(
        !backend.get("acct/other").await?.exists(),
        "the stale write wrote part of its data"
    );
    // The refused write did not lower the highest seen: 4 is still stale.
    expect_err!(
        sink.write_fenced(
            "acct",
            Fence(4),
            vec![Mutation::put("acct/balance", "four")]
        )
        .await,
        SideEffectError::FenceStale,
        "fence 4 after 5 and a refused 3"
    );
    Ok(())
}

/// Rule 46: an equal fence is allowed (several writes of one holder).
pub async fn rule_46_sink_equal_fence_allowed(fx: Fixture) -> CheckResult {
    let backend = fx.backend().await?;
    let sink = fx.sink().await?;
    sink.write_fenced("acct", Fence(4), vec![Mutation::put("acct/balance", "a")])
        .await?;
    sink.write_fenced("acct", Fence(4), vec![Mutation::put("acct/balance", "b")])
        .await
        .map_err(|e| Failure::new(format!("second write with the same fence: {e}")))?;
    let value = backend.get("acct/balance").await?.value;
    ensure!(
        value.as_deref() == Some(&b"b"[..]),
        "data after two equal-fence writes: {value:?}"
    );
    expect_err!(
        sink.write_fenced("acct", Fence(3), vec![Mutation::put("acct/balance", "c")])
            .await,
        SideEffectError::FenceStale,
        "lower fence after equal ones"
    );
    Ok(())
}

/// Rule 47: a higher fence is applied and becomes the highest seen, compare
/// and write in one step: racing writers end with the highest one's write.
pub async fn rule_47_sink_atomic_race(fx: Fixture) -> CheckResult {
    const WRITERS: u64 = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
    let mut tasks = Vec::new();
    for fence in 1..=WRITERS {
        let sink = fx.sink().await?;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let write = vec![Mutation::put("acct/balance", format!("w{fence}"))];
            (fence, sink.write_fenced("acct", Fence(fence), write).await)
        }));
    }
    for task in tasks {
        let (fence, written) = join(task).await?;
        match written {
            Ok(()) | Err(SideEffectError::FenceStale) if fence < WRITERS => {}
            Ok(()) => {}
            other => {
                return Err(Failure::new(format!(
                    "writer with fence {fence}: {other:?}"
                )))
            }
        }
    }
    let backend = fx.backend().await?;
    let value = backend.get("acct/balance").await?.value;
    ensure!(
        value.as_deref() == Some(format!("w{WRITERS}").as_bytes()),
        "after the race the data is {:?}, expected the highest fence's write",
        value.map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    let sink = fx.sink().await?;
    expect_err!(
        sink.write_fenced("acct", Fence(WRITERS - 1), vec![]).await,
        SideEffectError::FenceStale,
        "after the race, a fence below the highest"
    );
    sink.write_fenced("acct", Fence(WRITERS), vec![])
        .await
        .map_err(|e| Failure::new(format!("after the race, the highest fence itself: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn macro_lists_every_case() {
        let source = include_str!("sideeffect.rs");
        let cases = super::cases();
        assert_eq!(cases.len(), 47, "one check per numbered rule");
        for (i, case) in cases.iter().enumerate() {
            assert!(
                case.name.starts_with(&format!("rule_{:02}_", i + 1)),
                "case {} is {}",
                i + 1,
                case.name
            );
            assert!(
                source.contains(&format!("            {},\n", case.name)),
                "sideeffect_tests! does not list {}",
                case.name
            );
        }
    }
}
