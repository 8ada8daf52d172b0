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
//!
//! Layout: this file holds the harness ([`Fixture`], [`Rule`], the runners
//! and the case lists); the checks live in one private file per theme
//! (`acquire`, `lease`, `uncertain`, `runner`, `sink`) and are re-exported
//! here, so each is reachable as `sideeffect::rule_NN_…`; `helpers` and
//! `doubles` hold what the checks share.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::sideeffect::{
    BackendFencedSink, FencedSink, Runner, SideEffectAdapter, SideEffectError, SideEffectStore,
};
use coord_backend::{Backend, Clock, ManualClock, Mutation};

use crate::{unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

mod acquire;
mod doubles;
mod helpers;
mod lease;
mod runner;
mod sink;
mod uncertain;

pub use acquire::{
    rule_01_invalid_action, rule_02_one_atomic_step, rule_03_completed_outranks_busy,
    rule_04_uncertain_outranks_busy, rule_05_live_intent_contended, rule_06_dead_intent_uncertain,
    rule_07_busy_resource_contended, rule_08_grant_fence_and_intent, rule_09_fences_never_reused,
    rule_10_takeover_after_expiry,
};
pub use lease::{
    rule_11_complete_records_result, rule_12_complete_first_result_wins,
    rule_13_complete_stale_fence, rule_14_complete_released_lease, rule_15_complete_other_resource,
    rule_16_release_frees_resource_only, rule_17_stale_release, rule_18_renew_extends,
    rule_19_renew_after_takeover, rule_20_renew_after_expiry, rule_21_renew_atomic,
    rule_22_abandon_allows_rerun, rule_23_abandon_stale_lease,
};
pub use runner::{
    rule_35_runner_no_store, rule_36_runner_replays_completed, rule_37_runner_contended,
    rule_38_runner_prepare_fails, rule_39_runner_ownership_check, rule_40_runner_apply_gets_lease,
    rule_41_runner_apply_fails_safe, rule_42_runner_apply_fails_unknown,
    rule_43_runner_complete_fails, rule_44_runner_reconcile_and_run,
};
pub use sink::{
    rule_45_sink_lower_fence_rejected, rule_46_sink_equal_fence_allowed, rule_47_sink_atomic_race,
};
pub use uncertain::{
    rule_24_uncertain_per_key, rule_25_mark_uncertain_idempotent,
    rule_26_mark_uncertain_stale_fence, rule_27_mark_uncertain_one_txn, rule_28_resolve_applied,
    rule_29_resolve_not_applied, rule_30_first_resolution_wins, rule_31_resolve_not_uncertain,
    rule_32_resolve_without_lease, rule_33_one_reconciler, rule_34_owned_resolve,
};

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

crate::__define_suite! {$
    /// The side-effect suite's one list of rules (see [`crate::__define_suite!`]).
    __sideeffect_suite "sideeffect" |factory, check, name| run_case(factory, name, check);
    /// Every case of the side-effect suite, against the real adapter ([`adapter_store`]).
    cases;
    /// Expand the side-effect suite into one `#[tokio::test]` per rule for a
    /// [`BackendFactory`] expression (evaluated once per test).
    sideeffect_tests(sideeffect);
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
}

/// Every rule check, in rule order, runnable with any [`StoreFactory`].
pub fn rules() -> Vec<Rule> {
    __sideeffect_suite!(names [crate::__named_checks] (Fixture => Rule;))
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_case_per_numbered_rule_in_order() {
        let cases = super::cases();
        assert_eq!(cases.len(), 47, "one check per numbered rule");
        for (i, case) in cases.iter().enumerate() {
            assert!(
                case.name.starts_with(&format!("rule_{:02}_", i + 1)),
                "case {} is {}",
                i + 1,
                case.name
            );
        }
    }
}
