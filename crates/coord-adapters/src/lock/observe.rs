//! Spans and metrics of lock calls, for every [`Lock`](super::Lock)
//! implementation (this crate's and the native ones outside it). The
//! metric names live in [`crate::telemetry`], which knows no lock type:
//! this module turns lock answers into its plain label values.

use tracing::Instrument;

use super::{LockError, LockHandle, LostReason};
use crate::telemetry;

impl LostReason {
    /// The value of the `reason` label of the lock, read-write lock and
    /// election "lost" counters.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::TakenOver => "taken_over",
            LostReason::NotHeld => "not_held",
        }
    }
}

/// Count a lost lock in [`telemetry::LOCK_LOST_TOTAL`] when `error` is
/// [`LockError::Lost`] (and nothing otherwise); for [`Lock`](super::Lock)
/// implementations outside this crate, from their `renew`.
pub fn lock_lost_if(error: &LockError) {
    if let LockError::Lost { reason, .. } = error {
        telemetry::lock_lost(reason.label());
    }
}

/// The answer of a `renew`, counted in [`telemetry::LOCK_LOST_TOTAL`] when
/// it is [`LockError::Lost`].
pub(crate) fn renewed(answer: Result<(), LockError>) -> Result<(), LockError> {
    if let Err(error) = &answer {
        lock_lost_if(error);
    }
    answer
}

/// The span and metrics of one `try_lock`, shared by every [`Lock`](super::Lock)
/// implementation outside this crate: a `lock.try_lock` span with `key`,
/// `store` and (once granted) `fence`, and [`telemetry::LOCK_ACQUIRED_TOTAL`] on a grant.
pub async fn observe_try_lock(
    store: &str,
    key: &str,
    attempt: impl std::future::Future<Output = Result<Option<LockHandle>, LockError>>,
) -> Result<Option<LockHandle>, LockError> {
    let span =
        tracing::info_span!("lock.try_lock", key = %key, store, fence = tracing::field::Empty);
    let answer = attempt.instrument(span.clone()).await;
    if let Ok(Some(handle)) = &answer {
        span.record("fence", handle.fence());
        telemetry::lock_acquired();
    }
    answer
}

/// The span and metrics of one `renew` (see [`observe_try_lock`]):
/// [`telemetry::LOCK_LOST_TOTAL`] when it answers [`LockError::Lost`].
pub async fn observe_renew(
    store: &str,
    handle: &LockHandle,
    attempt: impl std::future::Future<Output = Result<(), LockError>>,
) -> Result<(), LockError> {
    let span =
        tracing::info_span!("lock.renew", key = %handle.key(), store, fence = handle.fence());
    renewed(attempt.instrument(span).await)
}

/// The span of one `release` of the lock on `key` held with `fence` (see
/// [`observe_try_lock`]; the handle itself moves into the release).
pub async fn observe_release(
    store: &str,
    key: &str,
    fence: u64,
    attempt: impl std::future::Future<Output = Result<(), LockError>>,
) -> Result<(), LockError> {
    let span = tracing::info_span!("lock.release", key = %key, store, fence);
    attempt.instrument(span).await
}
