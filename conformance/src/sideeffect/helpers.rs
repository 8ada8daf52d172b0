//! Small helpers the rule checks share: building actions and results,
//! acquiring with an expected outcome, reading back a whole namespace.
//!
//! Each helper turns an unexpected answer into a [`Failure`] that names what
//! was expected, so a check reads as the rule it states.

use std::sync::Arc;

use coord_adapters::sideeffect::{Acquired, Action, EffectResult, Lease, Outcome, SideEffectStore};
use coord_backend::{Backend, Entry};

use super::{Fixture, PAST_TTL, TTL};
use crate::{ensure, joined, CheckResult, Failure};

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

pub(super) fn action(key: &str, resource: &str) -> Action {
    Action::new(key, resource)
}

pub(super) fn result(text: &str) -> EffectResult {
    EffectResult::from(text)
}

/// Acquire; the outcome must be `Applied` with a lease.
pub(super) async fn grant(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
) -> Result<Lease, Failure> {
    let acquired = store.acquire(action, TTL).await?;
    ensure!(
        acquired.outcome() == Outcome::Applied,
        "acquire {:?} on {:?}: expected Applied, got {:?}",
        action.key,
        action.resource,
        acquired
    );
    acquired
        .into_lease()
        .ok_or_else(|| Failure::new("Applied without a lease"))
}

/// `first` is granted, then `second` takes its resource over once the lease
/// has expired: both leases.
pub(super) async fn taken_over(
    fx: &Fixture,
    store: &Arc<dyn SideEffectStore>,
    first: &Action,
    second: &Action,
) -> Result<(Lease, Lease), Failure> {
    let old = grant(store, first).await?;
    fx.advance(PAST_TTL);
    let new = grant(store, second).await?;
    Ok((old, new))
}

/// After a stale call of the old holder, the newer `holder` still holds:
/// `other` is contended (a failure says `context`) and the holder renews.
pub(super) async fn newer_holder_intact(
    fx: &Fixture,
    store: &Arc<dyn SideEffectStore>,
    (holder, lease): (&Action, &Lease),
    other: &Action,
    context: &str,
) -> CheckResult {
    contended_to_another(fx, other, context).await?;
    store
        .renew(holder, lease, TTL)
        .await
        .map_err(|e| Failure::new(format!("the newer holder lost its lease: {e}")))?;
    Ok(())
}

/// Acquire; the outcome must be `expected`, with no lease (and no result unless replayed).
pub(super) async fn expect_outcome(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
    expected: Outcome,
    context: &str,
) -> Result<Acquired, Failure> {
    let acquired = store.acquire(action, TTL).await?;
    ensure!(
        acquired.outcome() == expected,
        "{context}: acquire {:?} → {:?}, expected {expected:?}",
        action.key,
        acquired
    );
    // An outcome other than Applied carries no lease: the type says so.
    Ok(acquired)
}

/// Acquire; the outcome must be `Replayed` with `text` as result.
pub(super) async fn expect_replayed(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
    text: &str,
    context: &str,
) -> CheckResult {
    let acquired = expect_outcome(store, action, Outcome::Replayed, context).await?;
    ensure!(
        acquired.result().cloned() == Some(result(text)),
        "{context}: replayed {:?}, expected {text:?}",
        acquired.result().cloned()
    );
    Ok(())
}

/// Acquire, mark uncertain, release: the key is uncertain and the resource free.
pub(super) async fn make_uncertain(
    store: &Arc<dyn SideEffectStore>,
    action: &Action,
) -> Result<Lease, Failure> {
    let lease = grant(store, action).await?;
    store.mark_uncertain(action, &lease, "conformance").await?;
    store.release(action, &lease).await?;
    Ok(lease)
}

/// Every key of the namespace with its entry.
pub(super) async fn dump(backend: &Arc<dyn Backend>) -> Result<Vec<Entry>, Failure> {
    let keys = backend.keys("").await?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    Ok(backend.snapshot(&keys).await?)
}

pub(super) fn io_error(text: &str) -> std::io::Error {
    std::io::Error::other(text.to_owned())
}

pub(super) async fn join<T>(task: tokio::task::JoinHandle<T>) -> Result<T, Failure> {
    joined(task, "a racing task").await
}
pub(super) use expect_err;

/// Acquire through a new client (another process), which must get
/// `Uncertain`: the key's unknown outcome is everyone's.
pub(super) async fn uncertain_to_another(
    fx: &Fixture,
    action: &Action,
    context: &str,
) -> CheckResult {
    expect_outcome(&fx.store().await?, action, Outcome::Uncertain, context).await?;
    Ok(())
}

/// Acquire through a new client (another process), which must get
/// `Contended`: someone else's live lease is in the way.
pub(super) async fn contended_to_another(
    fx: &Fixture,
    action: &Action,
    context: &str,
) -> CheckResult {
    expect_outcome(&fx.store().await?, action, Outcome::Contended, context).await?;
    Ok(())
}

/// Acquire through a new client (another process), which must get a grant
/// (`Applied` with a lease); a failure says `context`.
pub(super) async fn granted_to_another(
    fx: &Fixture,
    action: &Action,
    context: &str,
) -> Result<Lease, Failure> {
    grant(&fx.store().await?, action)
        .await
        .map_err(|f| Failure::new(format!("{context}: {f}")))
}

/// Acquire through a new client (another process), which must get
/// `Replayed` with `text` as result.
pub(super) async fn replayed_to_another(
    fx: &Fixture,
    action: &Action,
    text: &str,
    context: &str,
) -> CheckResult {
    expect_replayed(&fx.store().await?, action, text, context).await
}
