//! [`Runner`]: the fixed order acquire → prepare → renew-check → apply(lease)
//! → complete, with one exit per failure.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument as _;

use super::error::{BoxError, SideEffectError};
use super::store::SideEffectStore;
use super::types::{
    Acquired, Action, EffectResult, Execution, Lease, Outcome, Resolution, RetrySafety,
};

/// Runs side effects through a [`SideEffectStore`] in the one safe order.
///
/// The order is the mechanism, so it is written once here:
///
/// 1. `acquire`: `Replayed` → the stored result, apply is not called;
///    `Contended` / `Uncertain` → returned as outcomes, nothing called.
/// 2. `prepare` (may be slow; applies nothing). Fails → the attempt is
///    abandoned; running the key again is safe ([`SideEffectError::PrepareFailed`]).
/// 3. `renew`: the ownership check right before applying. Lost →
///    [`SideEffectError::LeaseLost`] (outcome `Contended`), the attempt is
///    abandoned, apply is not called.
/// 4. `apply(prepared, lease)`: the only step that touches the outside world;
///    it gets the lease so it can pass [`Lease::fence`] downstream.
///    Fails → a [`RetrySafety::Safe`] action is abandoned
///    ([`SideEffectError::ApplyFailed`], retryable); otherwise the key is
///    marked uncertain and the resource released
///    ([`SideEffectError::OutcomeUnknown`]: reconcile before retrying).
/// 5. `complete(result)`: records the result and frees the resource in one
///    txn (so there is no separate release). Fails → the key is marked
///    uncertain, the resource released, [`SideEffectError::OutcomeUnknown`].
///
/// Long applies must renew the lease themselves (they hold it): the runner
/// checks ownership once, before applying.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::sideeffect::{
///     Action, EffectResult, Outcome, Runner, SideEffectAdapter, SideEffectStore,
/// };
/// use coord_memory::SingleProcessMemoryBackend;
///
/// let backend = Arc::new(SingleProcessMemoryBackend::new("runner-docs")?);
/// let store: Arc<dyn SideEffectStore> = Arc::new(SideEffectAdapter::new(backend));
/// let runner = Runner::new(store);
/// let action = Action::new("refund-9", "payments");
///
/// let first = runner
///     .execute(&action, Duration::from_secs(30), |lease| async move {
///         // call the payment API with `lease.fence` ...
///         Ok::<_, std::io::Error>(EffectResult::from(format!("refunded@{}", lease.fence.0).as_bytes()))
///     })
///     .await?;
/// assert_eq!(first.outcome, Outcome::Applied);
///
/// // A retry of the same logical action replays; the closure is not called.
/// let again = runner
///     .execute(&action, Duration::from_secs(30), |_lease| async {
///         unreachable!("already done");
///         #[allow(unreachable_code)]
///         Ok::<_, std::io::Error>(EffectResult::default())
///     })
///     .await?;
/// assert_eq!(again.outcome, Outcome::Replayed);
/// assert_eq!(again.result, first.result);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Runner {
    store: Option<Arc<dyn SideEffectStore>>,
}

impl Runner {
    /// A runner over `store`.
    pub fn new(store: Arc<dyn SideEffectStore>) -> Self {
        Runner { store: Some(store) }
    }

    /// A runner over an optional store: with `None`, every call fails with
    /// [`SideEffectError::NoStore`] (never a silent success).
    pub fn from_option(store: Option<Arc<dyn SideEffectStore>>) -> Self {
        Runner { store }
    }

    fn store(&self) -> Result<&Arc<dyn SideEffectStore>, SideEffectError> {
        self.store.as_ref().ok_or(SideEffectError::NoStore)
    }

    /// [`execute_with`](Runner::execute_with) without a prepare step (the
    /// ownership check before `apply` still happens).
    pub async fn execute<A, AFut, AE>(
        &self,
        action: &Action,
        ttl: Duration,
        apply: A,
    ) -> Result<Execution, SideEffectError>
    where
        A: FnOnce(Lease) -> AFut,
        AFut: Future<Output = Result<EffectResult, AE>>,
        AE: Into<BoxError>,
    {
        self.execute_with(
            action,
            ttl,
            || async { Ok::<(), Infallible>(()) },
            |(), lease| apply(lease),
        )
        .await
    }

    /// Run `action`: acquire → `prepare` → renew-check → `apply(prepared,
    /// lease)` → complete. See the type docs for each exit.
    ///
    /// `Ok` carries [`Outcome::Applied`] (with this call's result),
    /// [`Outcome::Replayed`] (with the stored result), or
    /// [`Outcome::Contended`] / [`Outcome::Uncertain`] (nothing was done;
    /// retry later / reconcile first).
    pub async fn execute_with<P, PFut, PE, T, A, AFut, AE>(
        &self,
        action: &Action,
        ttl: Duration,
        prepare: P,
        apply: A,
    ) -> Result<Execution, SideEffectError>
    where
        P: FnOnce() -> PFut,
        PFut: Future<Output = Result<T, PE>>,
        PE: Into<BoxError>,
        A: FnOnce(T, Lease) -> AFut,
        AFut: Future<Output = Result<EffectResult, AE>>,
        AE: Into<BoxError>,
    {
        let span = tracing::info_span!(
            "sideeffect.execute",
            key = %action.key,
            resource = %action.resource,
            retry_safety = %action.retry_safety,
        );
        let result = async {
            let store = self.store()?;
            let acquired = store.acquire(action, ttl).await?;
            tracing::debug!(step = "acquire", outcome = %acquired.outcome());
            let lease = match acquired {
                Acquired::Applied(lease) => lease,
                Acquired::Replayed(result) => {
                    tracing::info!(outcome = "replayed", "stored result returned, not applied");
                    return Ok(Execution {
                        outcome: Outcome::Replayed,
                        result: Some(result),
                    });
                }
                refused @ (Acquired::Contended | Acquired::Uncertain) => {
                    let outcome = refused.outcome();
                    tracing::info!(%outcome, "not applied");
                    return Ok(Execution {
                        outcome,
                        result: None,
                    });
                }
            };

            let prepared = match prepare().await {
                Ok(prepared) => prepared,
                Err(e) => {
                    let source = e.into();
                    tracing::warn!(step = "prepare", error = %source, "prepare failed; abandoning");
                    self.abandon(store, action, &lease, "prepare failed").await;
                    return Err(SideEffectError::PrepareFailed { source });
                }
            };

            // Preparing may have outlived the lease: applying now without this
            // check would run alongside a new holder.
            let lease = match store.renew(action, &lease, ttl).await {
                Ok(renewed) => renewed,
                Err(e) => {
                    tracing::warn!(step = "renew", error = %e, "ownership check failed; not applying");
                    self.abandon(store, action, &lease, "ownership check failed before apply")
                        .await;
                    return Err(match e {
                        SideEffectError::FenceStale => SideEffectError::LeaseLost,
                        other => other,
                    });
                }
            };

            tracing::debug!(step = "apply", fence = lease.fence.0);
            let applied = apply(prepared, lease.clone()).await;
            let result = match applied {
                Ok(result) => result,
                Err(e) => {
                    let source = e.into();
                    if action.retry_safety == RetrySafety::Safe {
                        tracing::warn!(step = "apply", error = %source, "apply failed; retry-safe action abandoned");
                        self.abandon(store, action, &lease, "apply failed (retry-safe)")
                            .await;
                        return Err(SideEffectError::ApplyFailed { source });
                    }
                    let reason = format!("apply failed: {source}");
                    tracing::error!(step = "apply", error = %source, "apply failed; outcome unknown");
                    self.mark_and_release(store, action, &lease, &reason).await;
                    return Err(SideEffectError::OutcomeUnknown {
                        reason,
                        source: Some(source),
                    });
                }
            };

            match store.complete(action, &lease, result).await {
                Ok(stored) => {
                    tracing::info!(
                        step = "complete",
                        outcome = "applied",
                        fence = lease.fence.0
                    );
                    Ok(Execution {
                        outcome: Outcome::Applied,
                        result: Some(stored),
                    })
                }
                Err(e) => {
                    let reason = format!("applied, but recording the result failed: {e}");
                    tracing::error!(step = "complete", error = %e, "complete failed after apply; outcome unknown");
                    self.mark_and_release(store, action, &lease, &reason).await;
                    Err(SideEffectError::OutcomeUnknown {
                        reason,
                        source: Some(Box::new(e)),
                    })
                }
            }
        }
        .instrument(span)
        .await;
        crate::telemetry::sideeffect(match &result {
            Ok(execution) => match execution.outcome {
                Outcome::Applied => "applied",
                Outcome::Replayed => "replayed",
                Outcome::Contended => "contended",
                Outcome::Uncertain => "uncertain",
            },
            Err(SideEffectError::OutcomeUnknown { .. }) => "outcome_unknown",
            Err(SideEffectError::LeaseLost | SideEffectError::FenceStale) => "lease_lost",
            Err(SideEffectError::PrepareFailed { .. }) => "prepare_failed",
            Err(SideEffectError::ApplyFailed { .. }) => "apply_failed",
            Err(_) => "error",
        });
        result
    }

    /// Drop an attempt that applied nothing. A failure here is logged, not
    /// returned: the caller's error matters more, and a leftover intent is
    /// safe (after its lease it reads as uncertain, never as free).
    async fn abandon(
        &self,
        store: &Arc<dyn SideEffectStore>,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) {
        // Nothing was applied, so a refused abandon is worth a few retries:
        // a leftover intent reads as uncertain and then needs a reconcile.
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=3 {
            match store.abandon(action, lease, reason).await {
                Ok(()) => return,
                Err(e) if e.is_retryable() && attempt < 3 => {
                    tracing::debug!(step = "abandon", error = %e, attempt, "abandon refused; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 4;
                }
                Err(e) => {
                    tracing::warn!(step = "abandon", error = %e, "could not abandon the attempt");
                    return;
                }
            }
        }
    }

    /// Mark the key uncertain, then free the resource. Failures are logged:
    /// if marking fails the intent stays and still blocks the key.
    async fn mark_and_release(
        &self,
        store: &Arc<dyn SideEffectStore>,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) {
        if let Err(e) = store.mark_uncertain(action, lease, reason).await {
            tracing::warn!(step = "mark_uncertain", error = %e, "could not mark the key uncertain");
        }
        if let Err(e) = store.release(action, lease).await {
            tracing::warn!(step = "release", error = %e, "could not release the resource");
        }
    }

    /// Resolve an uncertain key after checking downstream facts (no lease
    /// needed): `applied` → the key replays `resolution.result`; not applied
    /// → the key may run again. First resolution wins; a completed key
    /// answers `Replayed` with its stored result; any other key →
    /// [`SideEffectError::NotUncertain`].
    pub async fn reconcile(
        &self,
        action: &Action,
        resolution: Resolution,
    ) -> Result<Execution, SideEffectError> {
        let store = self.store()?;
        let span = tracing::info_span!("sideeffect.reconcile", key = %action.key, applied = resolution.applied);
        store
            .resolve_uncertain(action, &resolution)
            .instrument(span)
            .await
    }

    /// [`execute`](Runner::execute), keeping only the result: `Some(result)`
    /// when applied now or replayed, `None` when contended (retry later).
    /// An uncertain key is [`SideEffectError::OutcomeUnknown`]. Use
    /// `execute` when you must tell "done now" from "done before".
    pub async fn run<A, AFut, AE>(
        &self,
        action: &Action,
        ttl: Duration,
        apply: A,
    ) -> Result<Option<EffectResult>, SideEffectError>
    where
        A: FnOnce(Lease) -> AFut,
        AFut: Future<Output = Result<EffectResult, AE>>,
        AE: Into<BoxError>,
    {
        let execution = self.execute(action, ttl, apply).await?;
        match execution.outcome {
            Outcome::Applied | Outcome::Replayed => Ok(execution.result),
            Outcome::Contended => Ok(None),
            Outcome::Uncertain => Err(SideEffectError::OutcomeUnknown {
                reason: "a previous attempt's outcome is unknown; reconcile first".into(),
                source: None,
            }),
        }
    }
}
